"""A real Narad node for tests: started from a binary on a free port with a temp dir.

Like Pub/Sub's pstest, but the real broker rather than a fake, so tests meet the same
behaviour as production::

    with narad.testing.NaradServer() as server:
        with narad.Client(server.url) as client:
            ...

The binary is ``NARAD_BIN`` when set, else ``narad`` on the PATH. With pytest, the
``narad_url`` fixture (registered by this package's pytest plugin) does this for you.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

__all__ = ["NaradServer", "find_narad"]


def find_narad() -> str:
    """find_narad returns the narad binary: ``NARAD_BIN``, else ``narad`` on the PATH.

    Raises FileNotFoundError saying how to provide one.
    """
    given = os.environ.get("NARAD_BIN")
    if given:
        if not Path(given).is_file():
            raise FileNotFoundError(f"NARAD_BIN={given} is not a file")
        return str(Path(given).resolve())
    found = shutil.which("narad")
    if found is None:
        raise FileNotFoundError("no narad binary: set NARAD_BIN to one, or put narad on the "
                                "PATH (make build writes bin/narad)")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NaradServer:
    """NaradServer runs one narad node on 127.0.0.1, a free port and its own data dir.

    Args:
        binary: The narad binary (default: :func:`find_narad`).
        data_dir: Where the node keeps its data (default: a temp dir removed on stop).
        args: Extra ``narad serve`` flags.
        ready_timeout: How long to wait for ``/readyz`` before giving up.
    """

    def __init__(self, binary: str | None = None, *, data_dir: str | Path | None = None,
                 args: tuple[str, ...] = (), ready_timeout: float = 60.0) -> None:
        self.binary = binary or find_narad()
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(
            tempfile.mkdtemp(prefix="narad-test-"))
        self.args = args
        self.ready_timeout = ready_timeout
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start launches the node and returns its URL once it answers /readyz."""
        for _ in range(5):  # another process may take the free port first: try again
            port = _free_port()
            self.url = f"http://127.0.0.1:{port}"
            log = open(self.data_dir / f"narad-{port}.log", "wb")  # noqa: SIM115
            with log:
                self.proc = subprocess.Popen(
                    [self.binary, "serve", "--http-addr", f"127.0.0.1:{port}",
                     "--data-dir", str(self.data_dir / "data"), "--log-level", "warn",
                     *self.args], stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + self.ready_timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                        return self.url
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            self._halt()
        raise RuntimeError(f"narad did not become ready; see the logs in {self.data_dir}")

    def _halt(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.proc = None

    def stop(self) -> None:
        """Stop ends the node (SIGTERM, then SIGKILL) and removes a temp data dir."""
        self._halt()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> NaradServer:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
