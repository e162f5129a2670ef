"""The agent's log holds its own events: the HTTP client libraries' one line per Kubernetes
API request appears only at --log-level debug."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from gpuscope.agent import logs
from tests.doubles.kube_apiserver import KubeApiServer


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in logs.CHATTY}
    yield
    root.handlers[:], root.level = handlers, level
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


def api_log(tmp_path: Path, level: str) -> str:
    stream = io.StringIO()
    logs.setup("text", level, stream)
    with KubeApiServer() as api:
        api.add_pod("ml", "bert-0", node="n1")
        client = Client(KubeConfig.from_file(str(api.kubeconfig(tmp_path / "kubeconfig"))))
        assert len(list(client.list(Pod, namespace="*"))) == 1
        client.close()
    logging.getLogger("gpuscope.test").info("agent event")
    return stream.getvalue()


@pytest.mark.usefixtures("restore_logging")
def test_api_requests_are_not_logged_at_info(tmp_path: Path) -> None:
    text = api_log(tmp_path, "info")
    assert "agent event" in text  # the agent's own lines still come
    assert "HTTP Request" not in text and "/api/v1/pods" not in text


@pytest.mark.usefixtures("restore_logging")
def test_api_requests_are_logged_at_debug(tmp_path: Path) -> None:
    text = api_log(tmp_path, "debug")
    assert "HTTP Request: GET" in text and "/api/v1/pods" in text


@pytest.mark.usefixtures("restore_logging")
def test_client_warnings_still_come_at_info() -> None:
    stream = io.StringIO()
    logs.setup("text", "info", stream)
    logging.getLogger("httpx2").warning("certificate about to expire")
    assert "certificate about to expire" in stream.getvalue()
