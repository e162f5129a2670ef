"""What /healthz and /readyz say while a collector is stuck (docs/architecture.md, "Failure
model"): the agent stays live and ready, because a restart cannot cure a hung driver and a
readiness drop would take every other collector's series off Prometheus with it."""

from __future__ import annotations

import http.client
import threading
import time

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.serve.server import MetricsServer
from tests.unit.agent.test_deadlines import Gate


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def serve(agent: Agent) -> MetricsServer:
    server = MetricsServer(
        ("127.0.0.1", 0),
        agent.registry,
        agent.collector.render_text,
        lambda: agent.ready,
        health=agent.health_detail,
    )
    server.start()
    return server


def test_probes_while_a_collector_hangs_in_start() -> None:
    config = parse(["--collect-deadline", "0.3", "--collection-max-age", "0"], env={})
    hung, fine = Gate("hung", hold_start=True), Gate("fine")
    hung.hold()
    agent = Agent(config, sources=[hung, fine])  # type: ignore[list-item]
    server = serve(agent)
    try:
        assert get(server.port, "/readyz")[0] == 503  # before the first collection
        starting = threading.Thread(target=agent.start)
        starting.start()
        starting.join(10)
        assert agent.ready
        time.sleep(0.4)  # past the deadline
        status, body = get(server.port, "/healthz")
        assert status == 200
        assert body.startswith("ok\n")
        assert "stuck: hung for" in body
        assert get(server.port, "/readyz")[0] == 200
        status, metrics = get(server.port, "/metrics")
        assert status == 200
        assert 'gpuscope_collector_stuck{collector="hung"} 1.0' in metrics
        assert 'gpuscope_collector_success{collector="fine"} 1.0' in metrics
        hung.release()
        deadline = time.monotonic() + 10
        while "stuck" in get(server.port, "/healthz")[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert get(server.port, "/healthz") == (200, "ok\n")
    finally:
        hung.release()
        server.stop()
        agent.stop()
