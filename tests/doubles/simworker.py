"""One container's process on the simulated node (tests/doubles/simnode.py); standard library only.

Started as `python -I -S simworker.py [--serve]` inside the container's cgroup. With
`--serve` it listens on 127.0.0.1 (a free port) and reads and discards whatever peers send,
printing `recv <bytes>` when a connection ends. It prints `ready <port>` (0 when not
serving), then obeys commands on stdin, one a line:

  send <id> <host> <port> <bytes> <rate>
      open a TCP connection and send payload: exactly <bytes> bytes at once (rate 0),
      <bytes> bytes paced at <rate> bytes/s, or (bytes 0, rate > 0) <rate> bytes/s until
      the process ends. A finite transfer ends with shutdown(SHUT_WR) and waits for the peer
      to close, so every byte was read when it prints `done <id> <bytes>`. Failures print
      `error <id> <message>`.

The process stays alive, sending nothing else, until it is killed or its stdin closes (so a
crashed parent leaves no worker behind).
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time

CHUNK = 1 << 16
TICK = 0.1  # seconds between paced sends

_out = threading.Lock()


def say(*words: object) -> None:
    with _out:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()


def drain(conn: socket.socket) -> None:
    buf = bytearray(1 << 18)
    total = 0
    with conn:
        try:
            while n := conn.recv_into(buf):
                total += n
        except OSError:
            pass
        say("recv", total)  # before closing: the sender waits for the close


def serve(srv: socket.socket) -> None:
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def send_exact(conn: socket.socket, payload: bytes, nbytes: int) -> None:
    while nbytes > 0:
        n = min(nbytes, len(payload))
        conn.sendall(payload[:n])
        nbytes -= n


def send(ident: str, host: str, port: int, nbytes: int, rate: float) -> None:
    payload = b"s" * CHUNK
    try:
        with socket.create_connection((host, port), timeout=60) as conn:
            conn.settimeout(None)
            if rate <= 0:
                send_exact(conn, payload, nbytes)
            else:
                left = nbytes if nbytes > 0 else -1  # -1: forever
                per_tick = max(1, round(rate * TICK))
                next_at = time.monotonic()
                while left != 0:
                    n = per_tick if left < 0 else min(per_tick, left)
                    send_exact(conn, payload, n)
                    if left > 0:
                        left -= n
                    next_at += TICK
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    else:
                        next_at = time.monotonic()  # fell behind: do not burst to catch up
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(CHUNK):
                pass  # the peer closes once it has read everything
        say("done", ident, nbytes)
    except OSError as exc:
        say("error", ident, str(exc).replace("\n", " "))


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the parent
    port = 0
    if "--serve" in argv:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.bind(("127.0.0.1", 0))
        srv.listen(64)
        port = srv.getsockname()[1]
        threading.Thread(target=serve, args=(srv,), daemon=True).start()
    say("ready", port)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "send" and len(words) == 6:
            _, ident, host, dport, nbytes, rate = words
            threading.Thread(
                target=send, args=(ident, host, int(dport), int(nbytes), float(rate)), daemon=True
            ).start()
        else:
            say("error", "-", f"unknown command {line.strip()!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
