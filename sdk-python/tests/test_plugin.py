"""The pytest plugin: ``narad_url`` is a live node, usable as a user's tests would."""

from __future__ import annotations

import uuid

import narad


def test_narad_url_fixture_is_a_live_node(narad_url: str) -> None:
    assert narad_url.startswith("http://127.0.0.1:")
    with narad.Client(narad_url) as client:
        assert client.ready()
        t = f"plugin-{uuid.uuid4().hex[:8]}"
        client.create_topic(t)
        client.produce(t, b"hi")
        assert [m.body for m in client.receive(t, wait=5)] == [b"hi"]


def test_narad_server_stops_and_cleans_up(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    from narad.testing import NaradServer

    server = NaradServer(data_dir=tmp_path_factory.mktemp("own"))
    with server:
        assert narad.Client(server.url).ready()
        proc = server.proc
    assert server.proc is None and proc is not None and proc.poll() is not None
