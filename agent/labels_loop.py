"""Keeps the node's labels true: recomputed every `--labels-interval` seconds and within a
second of a GPU being lost or coming back (the sampler notices without an NVML call).

Publishing failures (no API server, RBAC) are logged once per change and retried on the
next round; they never touch the metrics path.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpuscope.agent.config import Config
from gpuscope.agent.gpu.collector import GPU
from gpuscope.agent.gpu.records import GpuSnapshot
from gpuscope.agent.gpu.source import GpuSource
from gpuscope.agent.placement import network_placement
from gpuscope.agent.sources import SourceRunner
from gpuscope.exporters.labels.gpu import gpu_labels, topology_annotation
from gpuscope.exporters.labels.publish import (
    NodeFeaturePublisher,
    NodePublisher,
    write_features_file,
)

log = logging.getLogger("gpuscope.labels")

Publish = Callable[[Mapping[str, str], Mapping[str, str], GpuSnapshot | None], bool]


def make_publisher(config: Config) -> Publish | None:
    """The publishing function for --labels-mode; None for `none`."""
    mode = config.labels.labels_mode
    if mode == "none":
        return None
    if mode == "file":
        directory = config.labels.labels_dir

        def to_file(labels: Mapping[str, str], _a: Mapping[str, str], _s: Any) -> bool:
            return write_features_file(directory, labels)

        return to_file

    # Built on first use, not here: without API access yet, the failure belongs to a round.
    made: list[Any] = []

    def publisher() -> Any:
        if not made:
            from gpuscope.agent.k8s.client import make_client

            client = make_client(config.agent.kubeconfig)
            node = config.agent.node_name
            if mode == "node":
                made.append(NodePublisher(client, node, config.labels.label_prefix))
            else:
                owner = None
                if os.environ.get("POD_NAME") and os.environ.get("POD_UID"):
                    owner = {"name": os.environ["POD_NAME"], "uid": os.environ["POD_UID"]}
                made.append(NodeFeaturePublisher(client, node, config.labels.namespace, owner))
        return made[0]

    def to_api(labels: Mapping[str, str], annotations: Mapping[str, str], snap: Any) -> bool:
        if mode == "node":
            return bool(publisher().publish(labels, annotations))
        return bool(publisher().publish(labels, snap))

    return to_api


class LabelsLoop:
    def __init__(
        self, config: Config, runner: SourceRunner, gpu: GpuSource | None, publish: Publish
    ) -> None:
        self._config = config
        self._runner = runner
        self._gpu = gpu
        self._publish = publish
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None
        self.rounds = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="labels", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run_once(self) -> None:
        self._refresh_fabric()
        collection = self._runner.collect(only=(GPU.name,))  # the labels need nothing else
        snap = collection.records(GPU)
        placement = network_placement(self._config.agent.sysfs, snap)
        prefix = self._config.labels.label_prefix
        labels = gpu_labels(snap, prefix, network=placement)
        annotations = (
            {f"{prefix}topology": topology_annotation(snap, placement)}
            if snap is not None and snap.gpus
            else {}
        )
        try:
            changed = self._publish(labels, annotations, snap)
        except Exception as exc:  # noqa: BLE001 - publishing must never stop the agent
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if message != self._last_error:
                log.error("publishing node labels failed: %s", message)
            self._last_error = message
            return
        if self._last_error is not None:
            log.info("publishing node labels recovered")
        self._last_error = None
        self.rounds += 1
        if changed:
            log.info("node labels published (%s)", self._config.labels.labels_mode)

    def _refresh_fabric(self) -> None:
        """The GPUs' fabric registration can complete (or degrade) after start: read it
        again each round. A failure here costs only this round's fresh fabric facts."""
        if self._gpu is None or not self._gpu.nvml.initialized:
            return
        try:
            self._gpu.refresh_fabric()
        except Exception as exc:  # noqa: BLE001 - the labels thread must keep running
            log.debug("re-reading the GPU fabric failed: %s", exc)

    def _lost(self) -> frozenset[str]:
        sampler = self._gpu.sampler if self._gpu is not None else None
        return sampler.lost() if sampler is not None else frozenset()

    def _run(self) -> None:
        interval = self._config.labels.labels_interval
        lost = self._lost()
        self.run_once()
        waited = 0.0
        while not self._stop.wait(1.0):
            waited += 1.0
            now_lost = self._lost()
            if now_lost != lost or waited >= interval:
                lost, waited = now_lost, 0.0
                self.run_once()
