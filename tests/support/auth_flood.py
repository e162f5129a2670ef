"""A wrong-password flood, as a process of its own: `--clients` TLS connections, each from
its own loopback source address (127.0.1.1, 127.0.1.2, ...), sending `/metrics` requests
with a wrong basic-auth password back to back on keep-alive (reconnecting when the agent
closes). Prints `flooding` once the first answers arrive, and at the end (`--seconds` or
SIGTERM) one JSON line: the count of each status. Used by tests/e2e/test_tls_e2e.py; run
it by hand against an agent to see what a flood does:

    python -m tests.support.auth_flood --port 9400 --ca ca.pem --clients 48 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import signal
import ssl
import sys
import time


async def _client(
    index: int, args: argparse.Namespace, context: ssl.SSLContext, counts: collections.Counter[str]
) -> None:
    token = base64.b64encode(f"{args.user}:wrong-{index}".encode()).decode()
    request = (
        f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {token}\r\n\r\n"
    ).encode()
    source = f"127.0.1.{index + 1}"
    stop_at = time.monotonic() + args.seconds
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    "127.0.0.1", args.port, ssl=context, local_addr=(source, 0)
                ),
                10,
            )
        except (TimeoutError, OSError) as exc:
            counts[f"connect: {type(exc).__name__}"] += 1
            await asyncio.sleep(0.1)
            continue
        try:
            while time.monotonic() < stop_at:
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                lines = head.decode("latin-1").split("\r\n")
                counts[lines[0].split(" ")[1]] += 1
                fields = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in lines[1:] if line)
                }
                await reader.readexactly(int(fields.get("content-length", "0")))
                if fields.get("connection", "").lower() == "close":
                    break
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            counts[f"error: {type(exc).__name__}"] += 1
        finally:
            writer.close()


async def _flood(args: argparse.Namespace) -> collections.Counter[str]:
    context = ssl.create_default_context(cafile=args.ca)
    counts: collections.Counter[str] = collections.Counter()
    tasks = [asyncio.create_task(_client(i, args, context, counts)) for i in range(args.clients)]
    while sum(counts.values()) < args.clients and not all(task.done() for task in tasks):
        await asyncio.sleep(0.05)
    print("flooding", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ended = asyncio.create_task(asyncio.wait(tasks))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([ended, stopped], return_when=asyncio.FIRST_COMPLETED)
    # The counts first: a client whose TLS connection is slow to wind down on a loaded
    # machine must not keep the caller from them (it kills us if we linger).
    print(json.dumps(dict(sorted(counts.items()))), flush=True)
    for task in (*tasks, ended, stopped):
        task.cancel()
    await asyncio.wait(tasks, timeout=5)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ca", required=True, help="the CA that signed the agent's certificate")
    parser.add_argument("--user", default="prometheus")
    parser.add_argument("--clients", type=int, default=48, help="at most 254")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    asyncio.run(_flood(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
