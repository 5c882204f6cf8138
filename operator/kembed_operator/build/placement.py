"""Where pods go and how long they may take to leave: topology spread, priority class and the
termination grace periods of worker and gateway pods. Pure functions over the spec; `manifests.py`
puts what they return into the pod templates.
"""

from __future__ import annotations

import math
from typing import Any

from kembed.operator.spec.spec import GatewaySpec, WorkerSpec
from kembed.operator.spec.traffic_spec import TrafficClassesSpec

TOPOLOGY_KEYS = {"nodes": "kubernetes.io/hostname", "zones": "topology.kubernetes.io/zone"}
# The worker's drain on SIGTERM (worker/__main__.py): it answers NOT_SERVING and refuses new requests
# at once (the gateway retries them on another replica), answers the stream requests in flight for up
# to 10 s, then gives unary calls up to 10 s (the gRPC server's stop grace); the batches already
# launched finish within milliseconds after that.
WORKER_DRAIN_S = 10 + 10
WORKER_GRACE_S = WORKER_DRAIN_S + 10  # room for the launched batches and the exit before SIGKILL
# A terminating gateway pod leaves the Service endpoints while it sleeps in preStop, then uvicorn stops
# accepting and finishes the requests in flight, each bounded by request_timeout_seconds.
GATEWAY_PRESTOP_S = 5
GATEWAY_EXIT_S = 5  # the lifespan shutdown (worker channels closed) and the exit


def worker_grace_s() -> int:
    """terminationGracePeriodSeconds of a worker pod: its whole drain, with room to exit. No preStop:
    the worker refuses new requests the moment it drains and the gateway retries them elsewhere at
    once, so there is nothing to wait for before SIGTERM."""
    return WORKER_GRACE_S


def gateway_grace_s(gateway: GatewaySpec) -> int:
    """terminationGracePeriodSeconds of a gateway pod: the preStop sleep, the longest request, the exit."""
    return GATEWAY_PRESTOP_S + math.ceil(gateway.request_timeout_seconds) + GATEWAY_EXIT_S


def spread_constraints(
    component: WorkerSpec | GatewaySpec, selector: dict[str, str], is_rolling: bool
) -> list[dict[str, Any]]:
    """topologySpreadConstraints over the pods `selector` picks. `is_rolling`: the Deployment's
    template changes in place (the gateway), so only pods of one template are counted: old pods on
    their way out must not push new ones onto crowded nodes."""
    spread = component.topology_spread
    out = []
    for field, key in TOPOLOGY_KEYS.items():
        when = getattr(spread, field)
        if when == "Off":
            continue
        constraint: dict[str, Any] = {
            "maxSkew": spread.max_skew,
            "topologyKey": key,
            "whenUnsatisfiable": when,
            "labelSelector": {"matchLabels": dict(selector)},
            # Count only nodes the pod may land on: a GPU worker's domains are the GPU nodes it
            # tolerates, not every node of the cluster.
            "nodeAffinityPolicy": "Honor",
            "nodeTaintsPolicy": "Honor",
        }
        if is_rolling:
            constraint["matchLabelKeys"] = ["pod-template-hash"]
        out.append(constraint)
    return out


def pod_placement(
    component: WorkerSpec | GatewaySpec, selector: dict[str, str], is_rolling: bool
) -> dict[str, Any]:
    """The placement fields of a pod spec: priority class and spread constraints, each only when set."""
    out: dict[str, Any] = {}
    if component.priority_class_name:
        out["priorityClassName"] = component.priority_class_name
    constraints = spread_constraints(component, selector, is_rolling)
    if constraints:
        out["topologySpreadConstraints"] = constraints
    return out


def millicores(quantity: int | str) -> int | None:
    """A CPU quantity in millicores (2, "1.5", "500m"); None when it is written some other way."""
    text = str(quantity).strip()
    try:
        if text.endswith("m"):
            return int(text[:-1])
        return math.ceil(float(text) * 1000)
    except ValueError:
        return None


def gateway_cores(gateway: GatewaySpec, classes: TrafficClassesSpec) -> int:
    """Cores a gateway pod runs busy on: one per gateway process and one per bulk tokenization child
    of each (trafficClasses.bulkTokenizationProcesses), which tokenize beside their parent's loop."""
    return gateway.processes * (1 + classes.bulk_tokenization_processes)


def gateway_resources(
    gateway: GatewaySpec, classes: TrafficClassesSpec, rendered: dict[str, Any]
) -> dict[str, Any]:
    """`rendered` (the container's resources from the spec) with a CPU request of at least one core per
    gateway process and bulk tokenization child (gateway_cores): each process is one event loop on one
    core, and a pod packed onto fewer cores than it has processes would have them take turns on the CPU
    (the children then slow the loops they were meant to relieve)."""
    requests = dict(rendered.get("requests", {}))
    cores = gateway_cores(gateway, classes)
    current = millicores(requests.get("cpu", 0))
    if current is not None and current < cores * 1000:
        requests["cpu"] = str(cores)
    return {**rendered, "requests": requests}
