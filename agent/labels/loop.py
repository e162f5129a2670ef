"""Keeps the node's labels true: recomputed every `--labels-interval` seconds and within a
second of a GPU being lost or coming back (the sampler notices without an NVML call).

Labels hold through faults (agent/labels/hold.py): a GPU collector that fails keeps the
labels last published, read back from the Node (or NodeFeature, or features file) after a
restart, with `gpu.healthy` 0; only an absence confirmed for `--labels-absence-grace`
seconds withdraws them. Every key and value is validated before a write: one that is not a
valid Kubernetes label is dropped (and logged once), the rest are published.

Publishing failures (no API server, RBAC) are logged once per change and retried on the
next round; they never touch the metrics path.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpuscope.agent.accelerators.records import AcceleratorSnapshot, AnyAccelerators
from gpuscope.agent.app.registry import accelerators
from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.labels.hold import AbsenceClock, Decision, Reading, classify, decide
from gpuscope.agent.net.placement import network_placement
from gpuscope.exporters.labels.gpu import gpu_labels, topology_annotation
from gpuscope.exporters.labels.publish import (
    NodeFeaturePublisher,
    NodePublisher,
    Published,
    read_features_file,
    write_features_file,
)
from gpuscope.exporters.labels.validation import validate

if TYPE_CHECKING:
    from gpuscope.agent.app.config import Config
    from gpuscope.agent.runtime.accelerators import DeviceWatch
    from gpuscope.agent.runtime.sources import Collection, SourceRunner
    from gpuscope.agent.runtime.spec import CollectorSpec

log = logging.getLogger("gpuscope.labels")

Publish = Callable[[Mapping[str, str], Mapping[str, str], AnyAccelerators | None], bool]
Recall = Callable[[], Published | None]


class Publisher:
    """A `Publish` function for one --labels-mode that can also read back what it published
    last (`recall`), so that a restarted agent knows which labels to hold."""

    def __init__(self, publish: Publish, recall: Recall) -> None:
        self._publish = publish
        self.recall = recall

    def __call__(
        self,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        snap: AnyAccelerators | None,
    ) -> bool:
        return self._publish(labels, annotations, snap)


def make_publisher(config: Config) -> Publisher | None:
    """The publisher for --labels-mode; None for `none`."""
    mode = config.labels.labels_mode
    if mode == "none":
        return None
    if mode == "file":
        directory = config.labels.labels_dir

        def to_file(labels: Mapping[str, str], _a: Mapping[str, str], _s: Any) -> bool:
            return write_features_file(directory, labels)

        return Publisher(to_file, lambda: read_features_file(directory))

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

    def recall() -> Published | None:
        published: Published | None = publisher().published()
        return published

    return Publisher(to_api, recall)


class LabelsLoop:
    """The labels thread. It labels the devices of the first enabled accelerator collector
    (agent/app/registry.py, `accelerators`) that finds any, or else the first that is not
    absent (an NVIDIA node's `gpu`, an AMD node's `amd`: one vendor per node), watched
    through `devices`, its source's `DeviceWatch` (one watch: the first collector's; or
    one per collector name). `publish` writes a label set; `recall` (by default the publisher's own,
    see `Publisher`) reads back the last one after a restart; `clock` times the absence
    grace."""

    def __init__(
        self,
        config: Config,
        runner: SourceRunner,
        devices: DeviceWatch | Mapping[str, DeviceWatch] | None,
        publish: Publish,
        *,
        recall: Recall | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._config = config
        self._runner = runner
        enabled = accelerators(config.collectors)
        if not enabled:
            raise ValueError("node labels need an accelerator collector in --collectors")
        self._enabled = enabled
        self._accelerator = enabled[0]  # the one labelled: chosen again each round
        if devices is None or isinstance(devices, Mapping):
            self._watches: Mapping[str, DeviceWatch] = dict(devices or {})
        else:
            self._watches = {enabled[0].name: devices}
        self._publish = publish
        if recall is None and isinstance(publish, Publisher):
            recall = publish.recall
        self._recall = recall
        self._clock = clock or SystemClock()
        self._absence = AbsenceClock(config.labels.labels_absence_grace)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None
        self._last: Published | None = None  # what the last successful round published
        self._recalled = False
        self._holding = False
        self._round_at: float | None = None  # when the last round ran, on `clock`
        self._dropped: set[str] = set()  # keys already logged as invalid
        self.rounds = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="labels", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run_once(self) -> None:
        self._refresh_topology()
        # The accelerator collectors only: the labels need nothing else.
        collection = self._runner.collect(only=tuple(k.name for k in self._enabled))
        key = self._accelerator = self._choose(collection)
        result = collection.result(key)
        snap = collection.records(key)
        reading = classify(result)
        self._round_at = self._clock.monotonic()
        confirmed = self._absence.observe(reading, self._round_at)
        try:
            decision = self._decide(reading, confirmed, snap)
            published = self._validated(decision)
            records = self._snap(snap, decision)
            changed = self._publish(published.labels, published.annotations, records)
        except Exception as exc:  # noqa: BLE001 - publishing must never stop the agent
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if message != self._last_error:
                log.error("publishing node labels failed: %s", message)
            self._last_error = message
            return
        if self._last_error is not None:
            log.info("publishing node labels recovered")
        self._last_error = None
        self._last = published
        self.rounds += 1
        self._log_hold(decision, reading, result.error if result is not None else None)
        if changed:
            log.info("node labels published (%s)", self._config.labels.labels_mode)

    def _decide(self, reading: Reading, confirmed: bool, snap: AnyAccelerators | None) -> Decision:
        placement = network_placement(self._config.agent.sysfs, snap.pci_bus_ids if snap else ())
        prefix = self._config.labels.label_prefix
        labels = gpu_labels(snap, prefix, network=placement)
        annotations = (
            {f"{prefix}topology": topology_annotation(snap, placement)}
            if snap is not None and snap.gpus
            else {}
        )
        last = self._last_published() if reading is not Reading.READ else self._last
        return decide(
            reading,
            confirmed,
            last.labels if last is not None else None,
            last.annotations if last is not None else None,
            labels,
            annotations,
            prefix,
        )

    def _last_published(self) -> Published | None:
        """What this agent published last; before its first round, what is where it publishes
        (read once: an agent restarted while the GPUs cannot be read holds those)."""
        if self._last is None and not self._recalled and self._recall is not None:
            self._last = self._recall()  # raises: this round fails, the next one reads again
        self._recalled = True
        return self._last

    @staticmethod
    def _snap(snap: AnyAccelerators | None, decision: Decision) -> AnyAccelerators | None:
        """The records the publisher gets: an empty snapshot when absence is confirmed (no
        GPUs, so no per-GPU NodeFeature instances either), None while GPUs cannot be read."""
        if decision.withdrawn and snap is None:
            return AcceleratorSnapshot(vendor="", driver_version="", library_version="", gpus=())
        return snap

    def _validated(self, decision: Decision) -> Published:
        """Drop every key or value the API would refuse (it refuses the whole patch for
        one), logging each key once."""
        checked = validate(decision.labels, decision.annotations)
        for key, why in checked.dropped.items():
            if key not in self._dropped:
                self._dropped.add(key)
                value = {**decision.labels, **decision.annotations}[key]
                log.error("not publishing node label %s=%.80r: %s", key, value, why)
        return Published(checked.labels, checked.annotations)

    def _log_hold(self, decision: Decision, reading: Reading, error: str | None) -> None:
        """One line when labels start being held, one when they are withdrawn, one when the
        GPUs are back."""
        if decision.holding and not self._holding:
            grace = self._config.labels.labels_absence_grace
            why = error or "some GPUs do not answer"
            until = (
                f"; withdrawn if still absent after {grace:g} s"
                if reading is Reading.ABSENT
                else ""
            )
            log.warning(
                "holding the %d node labels last published (gpu.healthy follows the GPUs): %s%s",
                len(decision.labels), why, until,
            )  # fmt: skip
        elif decision.withdrawn:
            log.warning(
                "GPUs confirmed absent for %g s: node labels withdrawn (gpu.present=false)",
                self._config.labels.labels_absence_grace,
            )
        elif self._holding and not decision.holding and not decision.withdrawn:
            log.info("GPUs readable again: node labels follow them")
        self._holding = decision.holding

    def _choose(self, collection: Collection) -> CollectorSpec[AnyAccelerators, Any]:
        """The collector to label from: the first that found devices, else the first that
        is not confirmed absent (its fault is this node's), else the first."""
        found = [k for k in self._enabled if (s := collection.records(k)) is not None and s.gpus]
        if found:
            return found[0]
        present = [
            k for k in self._enabled if (r := collection.result(k)) is not None and not r.absent
        ]
        return present[0] if present else self._enabled[0]

    @property
    def _devices(self) -> DeviceWatch | None:
        return self._watches.get(self._accelerator.name)

    def _refresh_topology(self) -> None:
        """The GPUs' fabric registration can complete (or degrade) after start: read it
        again each round. A failure here costs only this round's fresh fabric facts."""
        if self._devices is None:
            return
        try:
            self._devices.refresh_topology()
        except Exception as exc:  # noqa: BLE001 - the labels thread must keep running
            log.debug("re-reading the GPU topology failed: %s", exc)

    def _lost(self) -> frozenset[str]:
        return self._devices.lost_devices() if self._devices is not None else frozenset()

    def _absence_due(self) -> bool:
        """An absence reaches its grace between rounds: withdraw then, not a round later."""
        deadline = self._absence.deadline()
        if deadline is None or self._round_at is None or self._round_at >= deadline:
            return False
        return self._clock.monotonic() >= deadline

    def _run(self) -> None:
        interval = self._config.labels.labels_interval
        lost = self._lost()
        self.run_once()
        waited = 0.0
        while not self._stop.wait(1.0):
            waited += 1.0
            now_lost = self._lost()
            if now_lost != lost or waited >= interval or self._absence_due():
                lost, waited = now_lost, 0.0
                self.run_once()
