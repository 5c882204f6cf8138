"""The API calls the operator makes (`Cluster`) and `apply`, which brings one object to its body.

Objects are applied by a hash of their rendered body kept in an annotation: missing → created, hash
differs (or a Deployment was scaled behind our back) → patched, the same → left alone. That is also
how the drift timer repairs. A patch is a JSON merge patch, which leaves alone what it does not name,
so each object also keeps the keys (through nested objects, not into lists) of the body last applied,
and a patch names as null every key the new body no longer has: a nodeSelector entry, a Service
annotation or a pod label taken out of the spec leaves the object too, as `kubectl apply` would do.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Protocol

from kembed.operator.build.naming import Owner

APPLIED_HASH = "kembed.dev/applied-hash"
APPLIED_KEYS = "kembed.dev/applied-keys"  # the keys of the body last applied (module docstring)
# Keys a patch never removes: a Deployment's replicas once an autoscaler owns them (the body leaves
# them out then, and a null would scale the Deployment to 1 until the autoscaler acts).
KEPT_WHEN_ABSENT: dict[str, frozenset[tuple[str, ...]]] = {"Deployment": frozenset({("spec", "replicas")})}
# Fields a body carries only sometimes, for objects applied before APPLIED_KEYS existed: a patch names
# each of these that the new body lacks as null, and the API server removes it from the object.
UNSET_BY_PATCH: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (
        ("spec", "template", "spec", "priorityClassName"),
        ("spec", "template", "spec", "topologySpreadConstraints"),
    ),
    "PodDisruptionBudget": (("spec", "maxUnavailable"), ("spec", "minAvailable")),
}


class Cluster(Protocol):
    """The API calls the operator makes. `kind` is one of rbac.KINDS."""

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]: ...
    def serves(self, kind: str, namespace: str) -> bool: ...
    def create(self, body: dict[str, Any]) -> None: ...
    def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any]) -> None: ...
    def delete(self, kind: str, namespace: str, name: str) -> None: ...
    def delete_if_present(self, kind: str, namespace: str, name: str) -> None: ...
    def pod_log(self, namespace: str, name: str, container: str) -> str | None: ...
    def event(self, owner: Owner, type_: str, reason: str, message: str) -> None: ...


def _hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def apply(cluster: Cluster, body: dict[str, Any]) -> None:
    """Create `body` or bring the live object back to it. Jobs and ConfigMaps are immutable here."""
    meta = body["metadata"]
    digest = _hash(body)
    keys = json.dumps(_keys(body), sort_keys=True, separators=(",", ":"))
    annotations = {**meta.get("annotations", {}), APPLIED_HASH: digest, APPLIED_KEYS: keys}
    body = {**body, "metadata": {**meta, "annotations": annotations}}
    live = cluster.get(body["kind"], meta["namespace"], meta["name"])
    if live is None:
        cluster.create(body)
        return
    if body["kind"] == "Job":
        return  # a Job is named by revision and attempt: an existing one is the one wanted
    live_annotations = live["metadata"].get("annotations", {})
    is_same = live_annotations.get(APPLIED_HASH) == digest and APPLIED_KEYS in live_annotations
    if body["kind"] == "Deployment" and "replicas" in body["spec"]:  # left out: an autoscaler owns it
        is_same = is_same and live["spec"].get("replicas") == body["spec"]["replicas"]
    if is_same:
        return
    if body["kind"] == "ConfigMap" and body.get("immutable"):
        cluster.delete("ConfigMap", meta["namespace"], meta["name"])
        cluster.create(body)
        return
    cluster.patch(
        body["kind"], meta["namespace"], meta["name"], _patch(body, live_annotations.get(APPLIED_KEYS))
    )


KeyTree = dict[str, "KeyTree | None"]


def _keys(body: dict[str, Any]) -> KeyTree:
    """The keys of `body` as a tree: a nested object's keys under its key, None for any other value
    (a JSON merge patch replaces a list whole, so what is inside one needs no record)."""
    return {key: _keys(value) if isinstance(value, dict) else None for key, value in body.items()}


def _patch(body: dict[str, Any], applied_keys: str | None) -> dict[str, Any]:
    """`body` as a merge patch: null for each key of the body last applied that `body` lacks (or,
    for an object applied before that record, each of its kind's UNSET_BY_PATCH fields)."""
    patch = copy.deepcopy(body)
    kept = KEPT_WHEN_ABSENT.get(body["kind"], frozenset())
    if applied_keys is not None:
        _null_removed(patch, json.loads(applied_keys), (), kept)
        return patch
    for path in UNSET_BY_PATCH.get(body["kind"], ()):
        node: Any = patch
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.setdefault(path[-1], None)
    return patch


def _null_removed(
    patch: dict[str, Any], applied: KeyTree, path: tuple[str, ...], kept: frozenset[tuple[str, ...]]
) -> None:
    for key, below in applied.items():
        here = (*path, key)
        if key not in patch:
            if here not in kept and not (path == () and key == "status"):
                patch[key] = None
        elif below is not None and isinstance(patch[key], dict):
            _null_removed(patch[key], below, here, kept)
