"""The ValidatingAdmissionPolicy that confines the agent to its own labels on its own Node,
evaluated with a real CEL implementation (cel-python) the way the API server evaluates it:
matchConstraints, then matchConditions, then variables, then every validation in order, with
failurePolicy Fail turning an evaluation error into a denial.

cel-python is not cel-go. `list.join(sep)` (cel-go's strings extension, part of the API
server's CEL environment) is missing from it and supplied here. cel-python does not type-check,
and `object` here is a JSON map where the API server has a typed Node; the expressions stick to
what both implement (has(), in, startsWith, filter, ==, ?:, size, list +), but a type error only
the API server would report is not caught here: `kubectl apply --dry-run=server` on a 1.30+
cluster is the final check.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes

from tests.support import REPO

POLICY_FILE = REPO / "daemonset" / "base" / "policy" / "validating-admission-policy.yaml"
AGENT = "system:serviceaccount:gpuscope:gpuscope"
NODE_NAME = "authentication.kubernetes.io/node-name"
PREFIX = "gpuscope.io/"


def load() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert len(docs) == 2 and set(by_kind) == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    return by_kind["ValidatingAdmissionPolicy"], by_kind["ValidatingAdmissionPolicyBinding"]


POLICY, BINDING = load()


# --- a small admission evaluator ------------------------------------------------------------


def _join(items: celtypes.ListType, sep: celtypes.StringType | None = None) -> celtypes.StringType:
    """cel-go's strings extension `list.join(sep)`, which Kubernetes enables."""
    return celtypes.StringType(("" if sep is None else str(sep)).join(str(i) for i in items))


FUNCTIONS = {"join": _join}
ENV = celpy.Environment()
_PROGRAMS: dict[str, celpy.Runner] = {}


def program(expression: str) -> celpy.Runner:
    if expression not in _PROGRAMS:
        _PROGRAMS[expression] = ENV.program(ENV.compile(expression), functions=FUNCTIONS)
    return _PROGRAMS[expression]


def to_cel(value: Any) -> Any:
    """Python (JSON-shaped) data as CEL values: dict -> MapType, list -> ListType, ..."""
    return celpy.json_to_cel(value)


@dataclass
class Decision:
    applies: bool
    denials: list[str] = field(default_factory=list)  # messages, in validation order
    errors: list[str] = field(default_factory=list)  # evaluation errors (deny: failurePolicy)

    @property
    def allowed(self) -> bool:
        return not self.denials and not self.errors

    @property
    def message(self) -> str:
        """What the client sees: the API server reports the first denial."""
        return (self.denials + self.errors)[0] if not self.allowed else ""


def _rule_matches(operation: str, resource: str) -> bool:
    for rule in POLICY["spec"]["matchConstraints"]["resourceRules"]:
        if (
            "" in rule["apiGroups"]
            and "v1" in rule["apiVersions"]
            and operation in rule["operations"]
            and resource in rule["resources"]
        ):
            return True
    return False


def _activation(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    username: str,
    extra: Mapping[str, list[str]] | None,
    operation: str,
    subresource: str,
) -> dict[str, Any]:
    """The CEL variables the API server binds for one Node request (no params, no namespace)."""
    user: dict[str, Any] = {
        "username": username,
        "groups": ["system:serviceaccounts", "system:authenticated"],
    }
    if extra:  # omitempty: no extra at all when the token carries none
        user["extra"] = dict(extra)
    request = {
        "operation": operation,
        "name": new["metadata"]["name"],
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "subResource": subresource,
        "userInfo": user,
        "dryRun": False,
    }
    return {
        "object": to_cel(new),
        "oldObject": to_cel(old),
        "request": to_cel(request),
        "params": None,
        "namespaceObject": None,
    }


def _match_conditions(activation: dict[str, Any]) -> Decision | None:
    """matchConditions: any false -> the policy does not apply; else any error ->
    failurePolicy. None: every condition held, go on to the variables."""
    errors = []
    for condition in POLICY["spec"].get("matchConditions", []):
        try:
            result = program(condition["expression"]).evaluate(activation)
        except celpy.CELEvalError as exc:
            errors.append(f"matchCondition {condition['name']}: {exc}")
            continue
        if not isinstance(result, celtypes.BoolType):
            errors.append(f"matchCondition {condition['name']}: not a bool: {result!r}")
        elif not result:
            return Decision(applies=False)
    if errors:
        return Decision(applies=True, errors=errors)
    return None


def _as_cel_map(variables: dict[str, Any]) -> celtypes.MapType:
    return celtypes.MapType({celtypes.StringType(k): v for k, v in variables.items()})


def _bind_variables(activation: dict[str, Any]) -> Decision | None:
    """Variables, in order, each seeing the ones before it, into activation["variables"].
    A Decision (denied by failurePolicy) if one fails to evaluate, else None."""
    variables: dict[str, Any] = {}
    for variable in POLICY["spec"].get("variables", []):
        activation["variables"] = _as_cel_map(variables)
        try:
            variables[variable["name"]] = program(variable["expression"]).evaluate(activation)
        except celpy.CELEvalError as exc:
            return Decision(applies=True, errors=[f"variable {variable['name']}: {exc}"])
    activation["variables"] = _as_cel_map(variables)
    return None


def _validate(activation: dict[str, Any]) -> Decision:
    """Every validation in order: a false one denies with its message, an error one denies
    through failurePolicy; all are evaluated, as the API server reports them all."""
    decision = Decision(applies=True)
    for validation in POLICY["spec"]["validations"]:
        try:
            result = program(validation["expression"]).evaluate(activation)
        except celpy.CELEvalError as exc:
            decision.errors.append(f"expression {validation['expression']!r}: {exc}")
            continue
        if not isinstance(result, celtypes.BoolType):
            decision.errors.append(f"not a bool: {validation['expression']!r}")
        elif not result:
            decision.denials.append(_message(validation, activation))
    return decision


def admit(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    username: str = AGENT,
    extra: Mapping[str, list[str]] | None = None,
    operation: str = "UPDATE",
    subresource: str = "",
) -> Decision:
    """Evaluate the policy for one request, as the API server does."""
    resource = "nodes" + (f"/{subresource}" if subresource else "")
    if not _rule_matches(operation, resource):
        return Decision(applies=False)
    activation = _activation(old, new, username, extra, operation, subresource)
    early = _match_conditions(activation)
    if early is None:
        early = _bind_variables(activation)
    return early if early is not None else _validate(activation)


def _message(validation: Mapping[str, str], activation: dict[str, Any]) -> str:
    """messageExpression wins; if it fails or is empty the API server falls back to message."""
    if "messageExpression" in validation:
        try:
            text = str(program(validation["messageExpression"]).evaluate(activation))
        except celpy.CELEvalError as exc:
            raise AssertionError(f"messageExpression failed: {exc}") from exc
        assert "\n" not in text, "the API server rejects messages with line breaks"
        if text.strip():
            return text
    return validation.get("message") or f"failed expression: {validation['expression']}"


# --- Node fixtures --------------------------------------------------------------------------


def node(name: str = "gpu-node-1", **meta: Any) -> dict[str, Any]:
    """A realistic Node as the API server holds it (labels and annotations optional)."""
    n: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "6f1c0b7e-1111-4222-8333-944455556666",
            "resourceVersion": "4242",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                f"{PREFIX}gpu.present": "true",
                f"{PREFIX}gpu.count": "8",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                f"{PREFIX}owned-labels": f"{PREFIX}gpu.count,{PREFIX}gpu.present",
            },
        },
        "spec": {"podCIDR": "10.244.1.0/24", "providerID": "kind://docker/kind/" + name},
        "status": {
            "capacity": {"cpu": "224", "memory": "2113459456Ki", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"kubeletVersion": "v1.31.4"},
        },
    }
    for key, value in meta.items():
        if value is None:
            n["metadata"].pop(key, None)
        else:
            n["metadata"][key] = value
    return n


def token(node_name: str | None = "gpu-node-1") -> dict[str, list[str]]:
    """The extras of a Pod-bound service-account token (Kubernetes >= 1.30)."""
    extra = {
        "authentication.kubernetes.io/credential-id": ["JTI=3b0d8f6c-5c1e-4d0a-9d1b-2f1e0c9a7b6d"],
        "authentication.kubernetes.io/pod-name": ["gpuscope-7xk2p"],
        "authentication.kubernetes.io/pod-uid": ["0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"],
    }
    if node_name is not None:
        extra[NODE_NAME] = [node_name]
        extra["authentication.kubernetes.io/node-uid"] = ["6f1c0b7e-1111-4222-8333-944455556666"]
    return extra


def changed(old: dict[str, Any], edit: Any) -> dict[str, Any]:
    new = copy.deepcopy(old)
    edit(new)
    new["metadata"]["resourceVersion"] = "4243"  # the API server's own change: never compared
    new["metadata"]["managedFields"] = [{"manager": "gpuscope", "operation": "Update"}]
    return new


def labels(n: dict[str, Any]) -> dict[str, str]:
    return n["metadata"].setdefault("labels", {})


def annotations(n: dict[str, Any]) -> dict[str, str]:
    return n["metadata"].setdefault("annotations", {})


def as_agent(old: dict[str, Any], new: dict[str, Any], **kw: Any) -> Decision:
    kw.setdefault("extra", token(old["metadata"]["name"]))
    return admit(old, new, **kw)


# --- the policy's shape ---------------------------------------------------------------------


def test_policy_is_a_valid_validating_admission_policy() -> None:
    assert POLICY["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = POLICY["spec"]
    name_re = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    assert name_re.match(POLICY["metadata"]["name"])
    assert set(spec) <= {
        "failurePolicy", "matchConstraints", "matchConditions", "variables", "validations",
        "auditAnnotations", "paramKind",
    }  # fmt: skip
    assert spec["failurePolicy"] == "Fail"
    assert "paramKind" not in spec
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and rule["apiVersions"] == ["v1"]
    assert rule["operations"] == ["UPDATE"]
    assert "nodes" in rule["resources"]
    qualified = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
    for condition in spec["matchConditions"]:
        assert set(condition) == {"name", "expression"} and qualified.match(condition["name"])
    identifier = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9]*$")
    names = [v["name"] for v in spec["variables"]]
    assert len(names) == len(set(names)) and all(identifier.match(n) for n in names)
    for validation in spec["validations"]:
        assert set(validation) <= {"expression", "message", "messageExpression", "reason"}
        assert validation["expression"].strip()
        assert validation.get("message") or validation.get("messageExpression")
        assert "\n" not in validation.get("message", "")  # the API server rejects line breaks
        assert validation.get("reason", "Invalid") in {
            "Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge",
        }  # fmt: skip
    expressions = [c["expression"] for c in spec["matchConditions"]]
    expressions += [v["expression"] for v in spec["variables"]]
    for validation in spec["validations"]:
        expressions += [validation["expression"], validation.get("messageExpression", "true")]
    for expression in expressions:
        program(expression)  # every expression parses


def test_binding_denies_through_this_policy() -> None:
    assert BINDING["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert BINDING["spec"]["policyName"] == POLICY["metadata"]["name"]
    assert BINDING["spec"]["validationActions"] == ["Deny"]
    assert "paramRef" not in BINDING["spec"]


def test_the_agent_is_the_only_user_it_applies_to() -> None:
    (condition,) = POLICY["spec"]["matchConditions"]
    assert AGENT in condition["expression"]


# --- allowed: the agent's own keys on its own Node --------------------------------------------


def _add_own_label(n: dict[str, Any]) -> None:
    labels(n)[f"{PREFIX}gpu.family"] = "hopper"


def _change_own_label(n: dict[str, Any]) -> None:
    labels(n)[f"{PREFIX}gpu.count"] = "7"


def _remove_own_label(n: dict[str, Any]) -> None:
    del labels(n)[f"{PREFIX}gpu.present"]


def _set_topology(n: dict[str, Any]) -> None:
    annotations(n)[f"{PREFIX}topology"] = '{"gpu_gpu":[["x"]],"gpus":[],"v":1}'


def _change_owned_list(n: dict[str, Any]) -> None:
    annotations(n)[f"{PREFIX}owned-labels"] = f"{PREFIX}gpu.count,{PREFIX}gpu.family"


def _remove_owned_list(n: dict[str, Any]) -> None:
    del annotations(n)[f"{PREFIX}owned-labels"]


def _full_publish(n: dict[str, Any]) -> None:
    labels(n).update({f"{PREFIX}gpu.memory": "81559", f"{PREFIX}nvlink.domain": "a-b-c"})
    labels(n).pop(f"{PREFIX}gpu.present")
    annotations(n)[f"{PREFIX}topology"] = '{"v":1}'
    annotations(n)[f"{PREFIX}owned-labels"] = f"{PREFIX}gpu.count,{PREFIX}gpu.memory"


@pytest.mark.parametrize(
    "edit",
    [
        _add_own_label,
        _change_own_label,
        _remove_own_label,
        _set_topology,
        _change_owned_list,
        _remove_owned_list,
        _full_publish,
        lambda n: None,  # a no-op patch (only resourceVersion/managedFields move)
    ],
    ids=[
        "add-own-label",
        "change-own-label",
        "remove-own-label",
        "set-topology-annotation",
        "change-owned-labels-annotation",
        "remove-owned-labels-annotation",
        "labels-and-annotations-together",
        "no-op",
    ],
)
def test_agent_may_change_its_own_keys_on_its_own_node(edit: Any) -> None:
    old = node()
    decision = as_agent(old, changed(old, edit))
    assert decision.applies
    assert decision.allowed, decision.denials + decision.errors


def test_node_without_labels_or_annotations_maps_gets_its_first_own_keys() -> None:
    old = node(labels=None, annotations=None)
    assert "labels" not in old["metadata"] and "annotations" not in old["metadata"]

    def first_publish(n: dict[str, Any]) -> None:
        labels(n)[f"{PREFIX}gpu.present"] = "false"
        annotations(n)[f"{PREFIX}owned-labels"] = f"{PREFIX}gpu.present"

    decision = as_agent(old, changed(old, first_publish))
    assert decision.allowed, decision.denials + decision.errors
    # ... and a no-op on a Node that has neither map, before or after.
    assert as_agent(old, changed(old, lambda n: None)).allowed


def test_removing_its_last_keys_may_leave_no_labels_map_at_all() -> None:
    old = node(
        labels={f"{PREFIX}gpu.present": "false"},
        annotations={f"{PREFIX}owned-labels": f"{PREFIX}gpu.present"},
    )

    def uninstall(n: dict[str, Any]) -> None:
        del n["metadata"]["labels"]  # an emptied map is omitted, as the API server stores it
        del n["metadata"]["annotations"]

    decision = as_agent(old, changed(old, uninstall))
    assert decision.allowed, decision.denials + decision.errors


# --- forbidden ----------------------------------------------------------------------------------


def set_label(key: str, value: str) -> Any:
    return lambda n: labels(n).__setitem__(key, value)


def set_annotation(key: str, value: str) -> Any:
    return lambda n: annotations(n).__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "culprit"),
    [
        (set_label("kubernetes.io/hostname", "evil"), "kubernetes.io/hostname"),
        (set_label("nvidia.com/gpu.product", "NVIDIA-B200"), "nvidia.com/gpu.product"),
        (lambda n: labels(n).pop("nvidia.com/gpu.product"), "nvidia.com/gpu.product"),
        (set_label("node-role.kubernetes.io/gpu", ""), "node-role.kubernetes.io/gpu"),
        # Look-alike prefixes are someone else's keys.
        (set_label("gpuscope.io.evil.com/x", "1"), "gpuscope.io.evil.com/x"),
        (set_label("sub.gpuscope.io/x", "1"), "sub.gpuscope.io/x"),
        (set_label("gpuscope.io", "1"), "gpuscope.io"),
    ],
    ids=[
        "change-hostname",
        "change-nvidia-gpu-product",
        "remove-nvidia-gpu-product",
        "add-node-role",
        "lookalike-suffix",
        "lookalike-subdomain",
        "prefix-without-slash",
    ],
)
def test_agent_may_not_touch_foreign_labels(edit: Any, culprit: str) -> None:
    old = node()
    decision = as_agent(old, changed(old, edit))
    assert not decision.allowed
    assert decision.denials == [decision.message]  # exactly one rule fails: the labels rule
    assert "only labels under gpuscope.io/" in decision.message
    assert decision.message.endswith(f"it tried to change: {culprit}")


def test_foreign_label_changes_are_denied_even_mixed_with_own_ones() -> None:
    old = node()

    def both(n: dict[str, Any]) -> None:
        labels(n)[f"{PREFIX}gpu.count"] = "4"
        labels(n)["kubernetes.io/hostname"] = "elsewhere"

    decision = as_agent(old, changed(old, both))
    assert not decision.allowed
    assert "kubernetes.io/hostname" in decision.message
    assert f"{PREFIX}gpu.count" not in decision.message  # names only what it may not do


def test_dropping_the_whole_labels_map_removes_foreign_labels_and_is_denied() -> None:
    old = node()
    decision = as_agent(old, changed(old, lambda n: n["metadata"].pop("labels")))
    assert not decision.allowed
    for key in ("kubernetes.io/hostname", "kubernetes.io/os", "nvidia.com/gpu.product"):
        assert key in decision.message


ATTACH_DETACH = "volumes.kubernetes.io/controller-managed-attach-detach"
SCALE_DOWN = "cluster-autoscaler.kubernetes.io/scale-down-disabled"


@pytest.mark.parametrize(
    ("edit", "culprit"),
    [
        (
            lambda n: annotations(n).pop("node.alpha.kubernetes.io/ttl"),
            "node.alpha.kubernetes.io/ttl",
        ),
        (set_annotation(ATTACH_DETACH, "false"), ATTACH_DETACH),
        (set_annotation(SCALE_DOWN, "true"), SCALE_DOWN),
    ],
    ids=["remove-foreign-annotation", "change-foreign-annotation", "add-foreign-annotation"],
)
def test_agent_may_not_touch_foreign_annotations(edit: Any, culprit: str) -> None:
    old = node()
    decision = as_agent(old, changed(old, edit))
    assert not decision.allowed
    assert "only annotations under gpuscope.io/" in decision.message
    assert decision.message.endswith(f"it tried to change: {culprit}")


def test_agent_may_not_cordon_or_taint() -> None:
    old = node()
    cordon = as_agent(old, changed(old, lambda n: n["spec"].__setitem__("unschedulable", True)))
    assert not cordon.allowed and "spec" in cordon.message
    taint = {"key": "gpuscope.io/broken", "effect": "NoSchedule"}
    tainted = as_agent(old, changed(old, lambda n: n["spec"].__setitem__("taints", [taint])))
    assert not tainted.allowed and "spec" in tainted.message


def test_agent_may_not_change_status() -> None:
    old = node()

    def capacity(n: dict[str, Any]) -> None:
        n["status"]["capacity"]["nvidia.com/gpu"] = "16"

    for sub in ("status", ""):
        decision = as_agent(old, changed(old, capacity), subresource=sub)
        assert decision.applies and not decision.allowed
        assert decision.message == "the gpuscope agent may not change a Node's status"


def test_agent_may_not_add_finalizers() -> None:
    old = node()
    new = changed(old, lambda n: n["metadata"].__setitem__("finalizers", ["gpuscope.io/hold"]))
    decision = as_agent(old, new)
    assert not decision.allowed and "finalizers" in decision.message


def test_agent_may_not_patch_another_node() -> None:
    old = node("gpu-node-2")
    decision = admit(old, changed(old, _change_own_label), extra=token("gpu-node-1"))
    assert not decision.allowed
    assert decision.message == (
        "the gpuscope agent on node gpu-node-1 may not modify node gpu-node-2"
    )


@pytest.mark.parametrize(
    "extra",
    [
        None,  # no extra at all (a legacy Secret token)
        token(node_name=None),  # bound to a Pod, but without the node (feature gate off, < 1.30)
        {**token(), NODE_NAME: []},
        {**token(), NODE_NAME: ["gpu-node-1", "gpu-node-2"]},
    ],
    ids=["no-extra", "no-node-name", "empty-node-name", "two-node-names"],
)
def test_token_without_exactly_one_node_name_is_denied(
    extra: dict[str, list[str]] | None,
) -> None:
    old = node()
    decision = admit(old, changed(old, _change_own_label), extra=extra)
    assert decision.applies and not decision.allowed
    assert decision.denials == [decision.message]  # one clear reason, not a cascade
    assert NODE_NAME in decision.message
    assert not decision.errors


@pytest.mark.parametrize(
    "username",
    [
        "system:node:gpu-node-1",  # the kubelet
        "system:serviceaccount:kube-system:node-controller",
        "system:serviceaccount:gpuscope:default",
        "system:serviceaccount:other:gpuscope",
        "kubernetes-admin",
    ],
)
def test_other_users_are_not_subject_to_the_policy(username: str) -> None:
    old = node()

    def anything(n: dict[str, Any]) -> None:
        labels(n)["kubernetes.io/hostname"] = "renamed"
        n["spec"]["unschedulable"] = True

    decision = admit(old, changed(old, anything), username=username, extra=None)
    assert not decision.applies and decision.allowed


@pytest.mark.parametrize("operation", ["CREATE", "DELETE", "CONNECT"])
def test_only_updates_are_matched(operation: str) -> None:
    old = node()
    assert not admit(old, old, operation=operation, extra=token()).applies


def test_denials_never_come_from_evaluation_errors() -> None:
    """Every forbidden case above is denied by a rule with a message, not by failurePolicy."""
    old = node(labels=None, annotations=None)
    for new in (
        changed(old, lambda n: labels(n).__setitem__("kubernetes.io/hostname", "x")),
        changed(old, lambda n: annotations(n).__setitem__("a/b", "c")),
        changed(old, lambda n: n.pop("status")),
        changed(old, lambda n: n.pop("spec")),
    ):
        decision = as_agent(old, new)
        assert not decision.allowed and not decision.errors, decision.errors
