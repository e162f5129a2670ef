"""Publishing node labels: on the Node itself, or as an NFD local feature file.

Node mode patches only the agent's own keys. It records which keys it owns in an
annotation, so a key it stops emitting is removed on the next publish while labels and
annotations of anyone else are never in a patch at all. It patches only when something
changed, with the Node's resourceVersion, and retries on conflict. File mode writes NFD's
`features.d` format atomically (a dotfile, then rename), so NFD never reads half a file.

Each mode can also read back what it last published (`published()`, `read_features_file`):
after a restart that is what the labels loop holds while the GPUs cannot be read.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscope.exporters.labels.gpu import vendor_labels

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators

log = logging.getLogger("gpuscope.labels")

OWNED = "owned-labels"  # annotation (under the prefix) listing the keys the agent wrote


class PublishError(Exception):
    """Publishing failed; the message is one line."""


@dataclass(frozen=True, slots=True)
class Published:
    """The agent's own labels and annotations as they stand where it publishes them."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)


def node_patch(
    current_labels: Mapping[str, str],
    current_annotations: Mapping[str, str],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    prefix: str,
) -> dict[str, dict[str, str | None]]:
    """The merge patch that brings the Node's own-prefix keys to `labels`/`annotations`.

    Pure, so the rules are tested on literal dicts. Empty dict: nothing to change.
    """
    owned_key = f"{prefix}{OWNED}"
    owned = {k for k in current_annotations.get(owned_key, "").split(",") if k}
    wanted = {**labels, **annotations}
    for key in wanted:
        if not key.startswith(prefix):
            raise ValueError(f"refusing to write {key}: outside the agent's prefix {prefix}")
    label_patch: dict[str, str | None] = {
        k: v for k, v in labels.items() if current_labels.get(k) != v
    }
    annotation_patch: dict[str, str | None] = {
        k: v for k, v in annotations.items() if current_annotations.get(k) != v
    }
    for key in sorted(owned - set(wanted)):
        if not key.startswith(prefix):
            continue  # a tampered list never makes us delete someone else's key
        if key in current_labels:
            label_patch[key] = None
        if key in current_annotations:
            annotation_patch[key] = None
    owned_value = ",".join(sorted(wanted))
    if not wanted:
        if owned_key in current_annotations:
            annotation_patch[owned_key] = None  # uninstalled: not even the list is left
    elif current_annotations.get(owned_key) != owned_value:
        annotation_patch[owned_key] = owned_value
    patch: dict[str, dict[str, str | None]] = {}
    if label_patch:
        patch["labels"] = label_patch
    if annotation_patch:
        patch["annotations"] = annotation_patch
    return patch


class NodePublisher:
    """Node mode, through lightkube. `client` is a `lightkube.Client`."""

    def __init__(self, client: Any, node_name: str, prefix: str, *, attempts: int = 5) -> None:
        self._client = client
        self._node = node_name
        self._prefix = prefix
        self._attempts = attempts

    def publish(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
        """Bring the Node in line; True if it had to be patched."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        for attempt in range(self._attempts):
            try:
                node = self._client.get(Node, name=self._node)
                meta = node.metadata
                patch = node_patch(
                    meta.labels or {}, meta.annotations or {}, labels, annotations, self._prefix
                )
                if not patch:
                    return False
                body = {"metadata": {**patch, "resourceVersion": meta.resourceVersion}}
                self._client.patch(Node, self._node, body, patch_type=PatchType.MERGE)
                return True
            except ApiError as exc:
                if exc.status.code == 409 and attempt + 1 < self._attempts:
                    log.debug("node %s changed under us; retrying", self._node)
                    continue
                raise PublishError(
                    f"patching node {self._node}: {exc.status.code} {exc.status.message}"
                ) from exc
            except Exception as exc:  # transport errors: one line for the log
                raise PublishError(f"patching node {self._node}: {exc}") from exc
        raise PublishError(f"patching node {self._node}: still conflicting after retries")

    def remove(self) -> bool:
        """Remove every key the agent owns (uninstall): nothing is left half-written."""
        return self.publish({}, {})

    def published(self) -> Published | None:
        """The keys the owned-labels annotation lists, with their values on the Node now;
        None if the agent never published there (or its keys were removed)."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        try:
            meta = self._client.get(Node, name=self._node).metadata
        except ApiError as exc:
            raise PublishError(
                f"reading node {self._node}: {exc.status.code} {exc.status.message}"
            ) from exc
        except Exception as exc:  # transport errors: one line for the log
            raise PublishError(f"reading node {self._node}: {exc}") from exc
        return owned_keys(meta.labels or {}, meta.annotations or {}, self._prefix)


def owned_keys(
    labels: Mapping[str, str], annotations: Mapping[str, str], prefix: str
) -> Published | None:
    """What the owned-labels annotation says the agent wrote, as it is on the object."""
    owned_key = f"{prefix}{OWNED}"
    owned = {k for k in annotations.get(owned_key, "").split(",") if k.startswith(prefix)}
    if not owned:
        return None
    return Published(
        labels={k: labels[k] for k in sorted(owned) if k in labels},
        annotations={k: annotations[k] for k in sorted(owned) if k in annotations},
    )


def features_file_text(labels: Mapping[str, str]) -> str:
    """NFD's local feature file: one `name=value` per line (NFD keeps prefixed names as is)."""
    lines = [f"{key}={labels[key]}" for key in sorted(labels)]
    return (
        "# Written by gpuscope; NFD's local source publishes these labels.\n"
        + "\n".join(lines)
        + "\n"
    )


def read_features_file(directory: Path, name: str = "gpuscope") -> Published | None:
    """The labels a features file holds; None if there is none (or it cannot be read: then
    there is nothing to hold, and the next write says why)."""
    try:
        text = (directory / name).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    labels = {}
    for line in text.splitlines():
        key, equals, value = line.strip().partition("=")
        if equals and key and not key.startswith("#"):
            labels[key] = value
    return Published(labels=labels)


def write_features_file(directory: Path, labels: Mapping[str, str], name: str = "gpuscope") -> bool:
    """Write atomically into NFD's features.d; True if the content changed."""
    path = directory / name
    text = features_file_text(labels)
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


NFD_GROUP, NFD_VERSION = "nfd.k8s-sigs.io", "v1alpha1"
NFD_NODE_LABEL = "nfd.node.kubernetes.io/node-name"


def gpu_instances(snapshot: AnyAccelerators | None) -> list[dict[str, dict[str, str]]]:
    """Raw per-GPU attributes for NodeFeatureRules (`instances` in NFD's feature schema):
    the contract's, and the vendor's own (NVIDIA: compute_capability)."""
    out = []
    vendor = vendor_labels(snapshot) if snapshot is not None else None
    for g in snapshot.gpus if snapshot is not None else ():
        ident = g.identity
        attributes = {
            "index": str(ident.index),
            "uuid": ident.uuid,
            "model": ident.model,
            "pci_bus_id": ident.pci_bus_id,
            **(vendor.attributes(g) if vendor is not None else {}),
            "architecture": ident.architecture,
            "up": "true" if g.up else "false",
        }
        if ident.numa_node is not None:
            attributes["numa_node"] = str(ident.numa_node)
        if g.memory_total_bytes:
            attributes["memory_mib"] = str(g.memory_total_bytes // (1024 * 1024))
        out.append({"attributes": attributes})
    return out


class NodeFeaturePublisher:
    """NFD NodeFeature mode: one object per node in the agent's namespace, owned by the agent
    Pod (deleted with it), labels in `spec.labels`, raw per-GPU attributes in
    `spec.features`. NodeFeature is a CRD, which takes merge patches only."""

    def __init__(
        self, client: Any, node_name: str, namespace: str, owner: Mapping[str, str] | None = None
    ) -> None:
        from lightkube.generic_resource import create_namespaced_resource

        self._client = client
        self._node = node_name
        self._namespace = namespace
        self._owner = owner  # {"name": pod name, "uid": pod uid}
        self._kind = create_namespaced_resource(
            NFD_GROUP, NFD_VERSION, "NodeFeature", "nodefeatures"
        )
        self.name = f"gpuscope-{node_name}"

    def publish(self, labels: Mapping[str, str], snapshot: Any = None) -> bool:
        """Create or update the object; True if it was written. `snapshot` None means the
        GPUs could not be read: the per-GPU features already there are kept, not emptied
        (an empty snapshot is what says there are no GPUs)."""
        from lightkube import ApiError
        from lightkube.types import PatchType

        spec: dict[str, Any] = {
            "labels": dict(labels),
            "features": {
                "flags": {},
                "attributes": {},
                "instances": {"gpuscope.gpu": {"elements": gpu_instances(snapshot)}},
            },
        }
        try:
            try:
                current = self._client.get(self._kind, self.name, namespace=self._namespace)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
                self._client.create(self._kind(metadata=self._metadata(), spec=spec))
                return True
            if snapshot is None and (current.spec or {}).get("features"):
                spec["features"] = (current.spec or {})["features"]
            if dict(current.spec or {}) == spec:
                return False
            body = {"metadata": {"resourceVersion": current.metadata.resourceVersion}, "spec": spec}
            self._client.patch(
                self._kind, self.name, body, namespace=self._namespace, patch_type=PatchType.MERGE
            )
            return True
        except ApiError as exc:
            raise PublishError(
                f"NodeFeature {self._namespace}/{self.name}: {exc.status.code} {exc.status.message}"
            ) from exc

    def published(self) -> Published | None:
        """The labels of this node's NodeFeature object; None if there is none."""
        from lightkube import ApiError

        try:
            current = self._client.get(self._kind, self.name, namespace=self._namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise PublishError(
                f"NodeFeature {self._namespace}/{self.name}: {exc.status.code} {exc.status.message}"
            ) from exc
        labels = (current.spec or {}).get("labels") or {}
        return Published(labels={str(k): str(v) for k, v in labels.items()}) if labels else None

    def _metadata(self) -> Any:
        from lightkube.models.meta_v1 import ObjectMeta, OwnerReference

        owners = None
        if self._owner:
            owners = [
                OwnerReference(
                    apiVersion="v1",
                    kind="Pod",
                    name=self._owner["name"],
                    uid=self._owner["uid"],
                    controller=False,
                    blockOwnerDeletion=False,
                )
            ]
        return ObjectMeta(
            name=self.name,
            namespace=self._namespace,
            labels={NFD_NODE_LABEL: self._node},
            ownerReferences=owners,
        )
