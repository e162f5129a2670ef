"""Traffic generator the network tests run inside kubelet-style cgroups and namespaces.

Sends and receives exact payload byte counts, so the agent's per-pod counters can be
compared with what was really sent, to the byte.

  netgen.py tcp-server HOST PORT CONNS         prints "ready", then the bytes received
  netgen.py tcp-client HOST PORT BYTES CONNS [CHUNK]
  netgen.py udp-server HOST PORT DATAGRAMS     prints "ready", then the bytes received
  netgen.py udp-client HOST PORT DATAGRAMS SIZE
"""

from __future__ import annotations

import socket
import sys
import time


def tcp_server(host: str, port: int, conns: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, port))
        srv.listen(conns)
        print("ready", flush=True)
        total = 0
        for _ in range(conns):
            conn, _ = srv.accept()
            with conn:
                while chunk := conn.recv(1 << 16):
                    total += len(chunk)
        print(total, flush=True)


def tcp_client(host: str, port: int, nbytes: int, conns: int, chunk: int) -> None:
    payload = b"g" * chunk
    for _ in range(conns):
        with socket.create_connection((host, port), timeout=60) as conn:
            left = nbytes
            while left > 0:
                n = min(left, chunk)
                conn.sendall(payload[:n])
                left -= n
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(1 << 16):
                pass  # wait for the server to close: all data was read


def udp_server(host: str, port: int, datagrams: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, 33, 1 << 23)  # SO_RCVBUFFORCE: never drop a datagram
        sock.settimeout(30)
        sock.bind((host, port))
        print("ready", flush=True)
        total = 0
        for _ in range(datagrams):
            total += len(sock.recv(65536))
        print(total, flush=True)


def udp_client(host: str, port: int, datagrams: int, size: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for i in range(datagrams):
            sock.sendto(b"u" * size, (host, port))
            if i % 10 == 9:
                time.sleep(0.001)  # pace the burst a little


def main(argv: list[str]) -> None:
    mode, host, port, *rest = argv
    nums = [int(x) for x in rest]
    if mode == "tcp-server":
        tcp_server(host, int(port), *nums)
    elif mode == "tcp-client":
        tcp_client(host, int(port), nums[0], nums[1], nums[2] if len(nums) > 2 else 65536)
    elif mode == "udp-server":
        udp_server(host, int(port), *nums)
    elif mode == "udp-client":
        udp_client(host, int(port), *nums)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
