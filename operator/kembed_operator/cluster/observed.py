"""The world as the API server shows it, read for the state machine: each revision's worker
Deployment and ready pods (addresses, image digests), the gateways' rollout and the revisions their
pods still point at."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from kembed.operator.build import images as im
from kembed.operator.build import naming as n
from kembed.operator.build.naming import Owner
from kembed.operator.cluster.apply import Cluster
from kembed.operator.rollout.world import Gateway, Workers


def is_ready(pod: dict[str, Any]) -> bool:
    """A pod with an address, not terminating, whose Ready condition is True."""
    if pod["metadata"].get("deletionTimestamp") or not pod.get("status", {}).get("podIP"):
        return False
    conditions = pod["status"].get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _container_port(deployment: dict[str, Any]) -> int:
    port: int = deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    return port


def read_workers(cluster: Cluster, owner: Owner) -> dict[str, Workers]:
    selector = n.selector(owner, "worker")
    pods = [p for p in cluster.list("Pod", owner.namespace, selector) if is_ready(p)]
    found = {}
    for deployment in cluster.list("Deployment", owner.namespace, selector):
        revision = deployment["metadata"]["labels"].get(n.REVISION_LABEL, "")
        port = _container_port(deployment)
        addresses = sorted(
            f"{p['status']['podIP']}:{port}"
            for p in pods
            if p["metadata"]["labels"].get(n.REVISION_LABEL) == revision
        )
        digests = frozenset(
            d
            for p in pods
            if p["metadata"]["labels"].get(n.REVISION_LABEL) == revision and (d := im.pod_digest(p, "worker"))
        )
        found[revision] = Workers(deployment["spec"].get("replicas", 1), tuple(addresses), digests)
    return found


def read_gateway(cluster: Cluster, owner: Owner, components: Iterable[str] = ("gateway",)) -> Gateway | None:
    """The main gateway as observed; rolled out only when every gateway in `components` (the bulk one
    too, when the spec has it) is rolled out on the main gateway's revision: a revision is promoted,
    and the one before it retired, only once no gateway pod still sends work to the old one."""
    main, *others = (_read_gateway(cluster, owner, component) for component in components)
    if main is None:
        return None
    is_rolled_out = main.is_rolled_out and all(
        other is not None and other.revision == main.revision and other.is_rolled_out for other in others
    )
    in_use = {main.revision, *(other.revision for other in others if other is not None)}
    for pod in cluster.list("Pod", owner.namespace, {n.MODEL_LABEL: owner.name}):
        if pod["metadata"].get("labels", {}).get(n.COMPONENT_LABEL) in GATEWAY_COMPONENTS:
            in_use.add(pod["metadata"].get("annotations", {}).get(n.REVISION_LABEL, ""))
    # A stepwise rollout's gateway points at two revisions at once, annotated "<serving>+<candidate>".
    in_use = {revision for value in in_use for revision in value.split("+")} - {""}
    return dataclasses.replace(main, is_rolled_out=is_rolled_out, in_use=frozenset(in_use))


GATEWAY_COMPONENTS = ("gateway", n.BULK_GATEWAY)  # a bulk gateway being removed still counts


def read_endpoint_gateway(cluster: Cluster, owner: Owner, endpoint: str) -> Gateway | None:
    """The shared endpoint's gateway as one model sees it: the revision its template sends the
    model's work to, rolled out or not, and every revision its pods still send that work to."""
    live = cluster.get("Deployment", owner.namespace, n.endpoint_name(endpoint))
    if live is None:
        return None
    key = n.endpoint_revision_key(owner.name)
    observed = _observed(live, key)
    in_use = {observed.revision}
    for pod in cluster.list("Pod", owner.namespace, n.endpoint_selector(endpoint)):
        in_use.add(pod["metadata"].get("annotations", {}).get(key, ""))
    in_use = {revision for value in in_use for revision in value.split("+")} - {""}
    return dataclasses.replace(observed, in_use=frozenset(in_use))


def _read_gateway(cluster: Cluster, owner: Owner, component: str) -> Gateway | None:
    live = cluster.get("Deployment", owner.namespace, n.gateway_name(owner, component))
    if live is None:
        return None
    return _observed(live, n.REVISION_LABEL)


def _observed(live: dict[str, Any], revision_key: str) -> Gateway:
    spec, status = live["spec"], live.get("status", {})
    want = spec.get("replicas", 1)
    is_rolled_out = (
        status.get("observedGeneration", 0) >= live["metadata"].get("generation", 0)
        and status.get("updatedReplicas", 0) == want
        and status.get("replicas", 0) == want  # no pod of an older template left
        and status.get("availableReplicas", 0) == want
    )
    revision = spec["template"]["metadata"].get("annotations", {}).get(revision_key, "")
    return Gateway(revision, is_rolled_out, status.get("readyReplicas", 0))
