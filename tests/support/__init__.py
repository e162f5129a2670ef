"""What tests share besides fixtures: paths and constants, waiting, the root requirement, the
agent under test (in process or as the real binary), and parsers and renderers of what it
serves. The doubles it drives are in tests/doubles; the fixtures wrapping these are in the
conftest.py files."""

from tests.support.agents import (
    AgentProcess,
    AmdInProcess,
    InProcess,
    sim_node_args,
    spawn_agent,
    start_amd_inprocess,
    start_inprocess,
)
from tests.support.common import (
    GOLDEN_DIR,
    GPUSCOPE,
    HEADERS,
    REPO,
    REQUIRE_ROOT_ENV,
    T0,
    assert_golden,
    free_port,
    require_root,
    wait_for,
)

__all__ = [
    "GOLDEN_DIR",
    "GPUSCOPE",
    "HEADERS",
    "REPO",
    "REQUIRE_ROOT_ENV",
    "T0",
    "AgentProcess",
    "AmdInProcess",
    "InProcess",
    "assert_golden",
    "free_port",
    "require_root",
    "sim_node_args",
    "spawn_agent",
    "start_amd_inprocess",
    "start_inprocess",
    "wait_for",
]
