"""The plain-HTTP server's event loop (agent/serve/selector_loop.py) keeps asyncio's
contract where the server's connections rely on it: the cases tests/unit/agent/test_server.py
cannot provoke through HTTP (out of descriptors, a failing callback, write back-pressure,
half-closed peers, the timer heap, a closed loop)."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuscope.agent.serve import selector_loop
from gpuscope.agent.serve.selector_loop import SelectorLoop


class Recorder:
    """A protocol that records its callbacks and does what the test tells it."""

    def __init__(self, *, on_data: Callable[[Recorder, bytes], None] | None = None) -> None:
        self.events: list[tuple[str, Any]] = []
        self.transport: Any = None
        self.on_data = on_data
        self.keep_open_on_eof = False
        self.lost = threading.Event()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.events.append(("made", None))

    def data_received(self, data: bytes) -> None:
        self.events.append(("data", data))
        if self.on_data is not None:
            self.on_data(self, data)

    def eof_received(self) -> bool:
        self.events.append(("eof", None))
        return self.keep_open_on_eof

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append(("lost", exc))
        self.lost.set()

    def pause_writing(self) -> None:
        self.events.append(("pause", None))

    def resume_writing(self) -> None:
        self.events.append(("resume", None))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


class Harness:
    """A loop serving a listener on a thread of its own, as MetricsServer runs it."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.errors: list[dict[str, Any]] = []
        self.loop = SelectorLoop(lambda _loop, context: self.errors.append(context))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.loop.serve(self.listener, factory, 16)
        self.thread = threading.Thread(target=self.loop.run_until_stopped, daemon=True)
        self.thread.start()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def on_loop(self, callback: Callable[[], Any]) -> None:
        self.loop.call_soon_threadsafe(callback)

    def close(self) -> None:
        self.loop.stop()
        self.thread.join(5)
        self.loop.close()
        self.listener.close()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def made() -> Iterator[Callable[..., tuple[Harness, list[Recorder]]]]:
    harnesses: list[Harness] = []

    def make(**kwargs: Any) -> tuple[Harness, list[Recorder]]:
        protocols: list[Recorder] = []

        def factory() -> Recorder:
            protocols.append(Recorder(**kwargs))
            return protocols[-1]

        harness = Harness(factory)
        harnesses.append(harness)
        return harness, protocols

    yield make
    for harness in harnesses:
        harness.close()


def test_a_connection_is_made_then_reads_then_is_lost_once(made: Any) -> None:
    harness, protocols = made()
    with harness.connect() as client:
        client.sendall(b"hello")
        wait_for(lambda: protocols and ("data", b"hello") in protocols[0].events, "the data")
    assert protocols[0].lost.wait(5)
    assert protocols[0].names() == ["made", "data", "eof", "lost"]
    assert protocols[0].events[-1] == ("lost", None)


def test_eof_kept_open_lets_the_protocol_answer_a_half_closed_peer(made: Any) -> None:
    def answer_at_eof(protocol: Recorder, _data: bytes) -> None:
        protocol.keep_open_on_eof = True

    harness, protocols = made(on_data=answer_at_eof)
    client = harness.connect()
    client.sendall(b"question")
    client.shutdown(socket.SHUT_WR)  # what `nc -N` does after the request
    wait_for(lambda: protocols and "eof" in protocols[0].names(), "the EOF")
    assert "lost" not in protocols[0].names()
    harness.on_loop(lambda: protocols[0].transport.write(b"answer"))
    harness.on_loop(lambda: protocols[0].transport.close())
    assert client.recv(100) == b"answer"
    assert client.recv(100) == b""  # closed after the answer went out
    assert protocols[0].lost.wait(5)
    client.close()


def test_a_large_answer_pauses_and_resumes_the_protocol_and_all_of_it_arrives(
    made: Any,
) -> None:
    harness, protocols = made()
    client = harness.connect()
    wait_for(lambda: bool(protocols) and protocols[0].transport is not None, "the connection")
    body = bytes(range(256)) * (1 << 17)  # 32 MiB: far past the kernel socket buffers
    harness.on_loop(lambda: protocols[0].transport.write(body))
    wait_for(lambda: "pause" in protocols[0].names(), "pause_writing")
    received = bytearray()
    while len(received) < len(body):
        chunk = client.recv(1 << 16)
        assert chunk, "the connection closed early"
        received += chunk
    assert bytes(received) == body
    wait_for(lambda: "resume" in protocols[0].names(), "resume_writing")
    client.close()


def test_close_sends_what_is_buffered_and_abort_drops_it(made: Any) -> None:
    harness, protocols = made()
    graceful_client = harness.connect()
    wait_for(lambda: len(protocols) == 1 and protocols[0].transport is not None, "one")
    abrupt_client = harness.connect()
    wait_for(lambda: len(protocols) == 2 and protocols[1].transport is not None, "two")
    graceful, abrupt = protocols
    body = b"x" * (4 << 20)  # more than the kernel buffers: some is still buffered here
    harness.on_loop(lambda: (graceful.transport.write(body), graceful.transport.close()))
    harness.on_loop(lambda: (abrupt.transport.write(body), abrupt.transport.abort()))
    received = bytearray()
    while chunk := graceful_client.recv(1 << 16):
        received += chunk
    assert len(received) == len(body)
    assert graceful.lost.wait(5) and abrupt.lost.wait(5)
    abrupt_total = 0  # what the kernel had taken before the abort, then the end
    with contextlib.suppress(ConnectionResetError):
        while chunk := abrupt_client.recv(1 << 16):
            abrupt_total += len(chunk)
    assert abrupt_total < len(body)
    graceful_client.close()
    abrupt_client.close()


def test_a_failing_callback_is_reported_and_ends_only_its_connection(made: Any) -> None:
    def fail_on_boom(_protocol: Recorder, data: bytes) -> None:
        if b"boom" in data:
            raise ValueError("a bug in the protocol")

    harness, protocols = made(on_data=fail_on_boom)
    good, bad = harness.connect(), harness.connect()
    wait_for(lambda: len(protocols) == 2, "two connections")
    bad.sendall(b"boom")
    wait_for(lambda: any(p.lost.is_set() for p in protocols), "the failing one to end")
    lost = [p for p in protocols if p.lost.is_set()]
    assert len(lost) == 1
    assert isinstance(lost[0].events[-1][1], ValueError)
    assert [e["message"] for e in harness.errors] == ["protocol.data_received() call failed"]
    good.sendall(b"fine")
    wait_for(lambda: any(("data", b"fine") in p.events for p in protocols), "the other one")
    good.close()
    bad.close()


def test_out_of_descriptors_pauses_accepting_then_resumes(
    made: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selector_loop, "ACCEPT_RETRY_DELAY", 0.2)
    harness, protocols = made()
    real_accept = socket.socket.accept
    failures = [1]

    def accept(self: socket.socket) -> tuple[socket.socket, Any]:
        if self is harness.listener and failures:
            failures.pop()
            raise OSError(errno.EMFILE, "Too many open files")
        return real_accept(self)

    monkeypatch.setattr(socket.socket, "accept", accept)
    started = time.monotonic()
    with harness.connect():
        wait_for(lambda: bool(protocols), "the connection, accepted after the pause")
    assert time.monotonic() - started >= 0.15
    assert [e["message"] for e in harness.errors] == ["socket.accept() out of system resource"]
    assert harness.errors[0]["exception"].errno == errno.EMFILE


def test_timers_run_in_order_and_cancelled_ones_do_not_pile_up() -> None:
    loop = SelectorLoop()
    ran: list[str] = []
    loop.call_later(0.02, ran.append, "second")
    loop.call_later(0.01, ran.append, "first")
    loop.call_later(0.01, ran.append, "first, scheduled later").cancel()
    for _ in range(2000):  # a connection re-arms its deadline at every state change
        loop.call_later(60, ran.append, "never").cancel()
    assert len(loop._timers) < 200
    deadline = time.monotonic() + 5
    while len(ran) < 2 and time.monotonic() < deadline:
        loop.run_once(0.05)
    assert ran == ["first", "second"]
    loop.close()


def test_a_closed_loop_refuses_callbacks_from_other_threads() -> None:
    loop = SelectorLoop()
    loop.close()
    with pytest.raises(RuntimeError):
        loop.call_soon_threadsafe(lambda: None)
    with pytest.raises(RuntimeError):
        loop.stop()


def test_a_callback_from_another_thread_wakes_a_waiting_loop() -> None:
    loop = SelectorLoop()
    woke = threading.Event()
    thread = threading.Thread(target=loop.run_until_stopped, daemon=True)
    thread.start()
    time.sleep(0.05)  # the loop now waits in select() with no timer
    started = time.monotonic()
    loop.call_soon_threadsafe(woke.set)
    assert woke.wait(5)
    assert time.monotonic() - started < 1.0
    loop.stop()
    thread.join(5)
    assert not thread.is_alive()
    loop.close()
