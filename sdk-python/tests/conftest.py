"""Fixtures: the real broker binary, and one driver per client flavour.

Every test that takes ``drv`` runs twice: once with ``narad.Client`` and once with
``narad.AsyncClient`` seen through a bridge that runs each coroutine on a background
event loop. The test body is the same, so the two clients are held to the same cases.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import narad

# ---------------------------------------------------------------------------
# The broker


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_repo_root() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "go.work").exists():
            return parent
    raise RuntimeError("no go.work above the tests: set NARAD_BIN to the narad binary")


@pytest.fixture(scope="session")
def narad_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    given = os.environ.get("NARAD_BIN")
    if given:
        path = Path(given)
        if not path.is_file():
            raise RuntimeError(f"NARAD_BIN={given} is not a file")
        return str(path.resolve())
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("NARAD_BIN is unset and go is not installed to build the broker")
    out = tmp_path_factory.mktemp("bin") / "narad"
    subprocess.run([go, "build", "-o", str(out), "./cmd/narad"],
                   cwd=find_repo_root() / "broker", check=True)
    return str(out)


class Broker:
    """One narad process on a free port with its own data directory."""

    def __init__(self, binary: str, data_dir: Path, admin_password: str | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.admin_password = admin_password
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> None:
        for _ in range(5):
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            log = open(self.data_dir.parent / f"narad-{port}.log", "wb")  # noqa: SIM115
            env = dict(os.environ)
            env.pop("NARAD_ADMIN_PASSWORD", None)
            if self.admin_password:
                env["NARAD_ADMIN_PASSWORD"] = self.admin_password
            self.proc = subprocess.Popen(
                [self.binary, "serve", "--http-addr", f"127.0.0.1:{port}",
                 "--data-dir", str(self.data_dir), "--log-level", "warn", *self.args],
                stdout=log, stderr=subprocess.STDOUT, env=env)
            log.close()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break  # the port was taken meanwhile: try another
                try:
                    if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            self.stop()
        raise RuntimeError("the broker did not become ready")

    def stop(self) -> None:
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


@pytest.fixture(scope="session")
def broker(narad_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(narad_bin, tmp_path_factory.mktemp("broker") / "data")
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def other_broker(narad_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A second, independent node (not in a cluster with ``broker``): its own node id."""
    b = Broker(narad_bin, tmp_path_factory.mktemp("other") / "data",
               args=("--node-id", "other-node"))
    b.start()
    try:
        yield b
    finally:
        b.stop()


ADMIN_PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="session")
def secure_broker(narad_bin: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Broker]:
    """A second broker with security on: the user admin holds every right."""
    b = Broker(narad_bin, tmp_path_factory.mktemp("secure") / "data", ADMIN_PASSWORD)
    b.start()
    try:
        yield b
    finally:
        b.stop()


# ---------------------------------------------------------------------------
# Waiting


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Polls ``cond`` until it is truthy; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ---------------------------------------------------------------------------
# The async bridge


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="test-loop")
        self.thread.start()

    def run(self, coro: Any, timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


_ASYNC_TYPES = (narad.AsyncClient, narad.AsyncConsumer, narad.AsyncPublisher,
                narad.AsyncReplay)


class FutureBridge:
    """An asyncio.Future seen as a concurrent.futures.Future."""

    def __init__(self, fut: asyncio.Future[Any], lt: LoopThread) -> None:
        self._fut = fut
        self._lt = lt

    def result(self, timeout: float | None = 60.0) -> Any:
        async def get() -> Any:
            return await asyncio.wait_for(asyncio.shield(self._fut), timeout)
        return self._lt.run(get())

    def exception(self, timeout: float | None = 60.0) -> BaseException | None:
        try:
            self.result(timeout)
        except Exception as exc:
            return exc
        return None


class Bridge:
    """An async SDK object with the sync surface: every call runs on the loop thread."""

    def __init__(self, target: Any, lt: LoopThread) -> None:
        self._t = target
        self._lt = lt

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, _ASYNC_TYPES) or inspect.isasyncgen(value):
            return Bridge(value, self._lt)
        if isinstance(value, asyncio.Future):
            return FutureBridge(value, self._lt)
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._t, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            async def go() -> Any:
                r = attr(*args, **kw)
                if inspect.isawaitable(r):
                    r = await r
                return r
            return self._wrap(self._lt.run(go()))
        return call

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                yield self._lt.run(self._t.__anext__())
            except StopAsyncIteration:
                return

    def __next__(self) -> Any:
        try:
            return self._lt.run(self._t.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def __enter__(self) -> Bridge:
        self._lt.run(self._t.__aenter__())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lt.run(self._t.__aexit__(*exc))


# ---------------------------------------------------------------------------
# Fault injection at the transport: the same rules drive the sync and async flavours.

Rule = Callable[[httpx.Request, int], Any]
"""Given a request and how many requests matched before, returns None (forward), an
httpx.Response (answer it without forwarding), ("lost", exc) (forward, then lose the
reply by raising exc) or an exception instance (raise it without forwarding)."""


class FaultTransport(httpx.BaseTransport):
    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.inner = httpx.HTTPTransport()
        self.seen: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        n = len(self.seen)
        self.seen.append(request)
        action = self.rule(request, n)
        if isinstance(action, httpx.Response):
            return action
        if isinstance(action, BaseException):
            raise action
        resp = self.inner.handle_request(request)
        if isinstance(action, tuple) and action[0] == "lost":
            resp.read()
            resp.close()
            raise action[1]
        return resp


class AsyncFaultTransport(httpx.AsyncBaseTransport):
    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.inner = httpx.AsyncHTTPTransport()
        self.seen: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        n = len(self.seen)
        self.seen.append(request)
        action = self.rule(request, n)
        if isinstance(action, httpx.Response):
            return action
        if isinstance(action, BaseException):
            raise action
        resp = await self.inner.handle_async_request(request)
        if isinstance(action, tuple) and action[0] == "lost":
            await resp.aread()
            await resp.aclose()
            raise action[1]
        return resp


# ---------------------------------------------------------------------------
# The driver


class Driver:
    """What a test needs, in the flavour under test."""

    def __init__(self, mode: str, broker: Broker, lt: LoopThread | None) -> None:
        self.mode = mode
        self.broker = broker
        self.lt = lt
        self._clients: list[Any] = []
        self.client = self.new_client()

    @property
    def is_async(self) -> bool:
        return self.mode == "async"

    def new_client(self, endpoints: Any = None, *, rule: Rule | None = None,
                   **kw: Any) -> Any:
        eps = endpoints if endpoints is not None else self.broker.url
        transport: Any = None
        if self.is_async:
            assert self.lt is not None
            if rule is not None:
                transport = AsyncFaultTransport(rule)

            async def make() -> narad.AsyncClient:
                return narad.AsyncClient(eps, transport=transport, **kw)
            c: Any = Bridge(self.lt.run(make()), self.lt)
        else:
            if rule is not None:
                transport = FaultTransport(rule)
            c = narad.Client(eps, transport=transport, **kw)
        c.transport = transport  # for tests that count requests
        self._clients.append(c)
        return c

    def close(self) -> None:
        for c in reversed(self._clients):
            c.close()

    def topic(self, **settings: Any) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        settings.setdefault("partitions", 1)
        self.client.create_topic(name, **settings)
        return name

    # Handlers in the flavour under test.

    def handler(self, fn: Callable[[narad.Message], Any]) -> Any:
        if not self.is_async:
            return fn

        async def h(msg: narad.Message) -> Any:
            return fn(msg)
        return h

    def slow(self, seconds: float, fn: Callable[[narad.Message], Any] | None = None) -> Any:
        if not self.is_async:
            def h(msg: narad.Message) -> Any:
                time.sleep(seconds)
                return fn(msg) if fn is not None else None
            return h

        async def ah(msg: narad.Message) -> Any:
            await asyncio.sleep(seconds)
            return fn(msg) if fn is not None else None
        return ah

    def until_cancelled(self, started: Callable[[narad.Message], Any],
                        cancelled: Callable[[narad.Message], Any], limit: float = 60) -> Any:
        """A handler that blocks until the SDK cancels it, then reports it."""
        if not self.is_async:
            def h(msg: narad.Message) -> None:
                started(msg)
                d = narad.current_delivery()
                assert d is not None and d.message == msg
                if d.cancelled.wait(limit):
                    cancelled(msg)
            return h

        async def ah(msg: narad.Message) -> None:
            started(msg)
            try:
                await asyncio.sleep(limit)
            except asyncio.CancelledError:
                cancelled(msg)
                raise
        return ah


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(params=["sync", "async"])
def drv(request: pytest.FixtureRequest, broker: Broker, loop_thread: LoopThread
        ) -> Iterator[Driver]:
    d = Driver(request.param, broker, loop_thread if request.param == "async" else None)
    try:
        yield d
    finally:
        d.close()
