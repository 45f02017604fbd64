"""The pytest plugin of the Narad SDK: a ``narad_url`` fixture backed by a real node.

Installed with the package (entry point ``pytest11``), so a project that depends on
``narad`` can write::

    def test_orders(narad_url):
        with narad.Client(narad_url) as client:
            client.create_topic("orders")

One node serves the whole test session (start-up costs a fraction of a second, but
once is enough); use unique topic names per test. The binary is ``NARAD_BIN`` or
``narad`` on the PATH (see :mod:`narad.testing`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .testing import NaradServer


@pytest.fixture(scope="session")
def narad_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NaradServer]:
    """narad_server is a narad node for the test session, on a free port and a temp dir."""
    server = NaradServer(data_dir=tmp_path_factory.mktemp("narad"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def narad_url(narad_server: NaradServer) -> str:
    """narad_url is the base URL of the session's narad node (``http://127.0.0.1:<port>``)."""
    return narad_server.url
