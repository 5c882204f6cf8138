"""Pure builders of the autoscalers: a KEDA ScaledObject per serving worker revision, scaling it on its
own queue, and a HorizontalPodAutoscaler for the gateway on CPU. No I/O.

An authenticated Prometheus (spec.autoscaling.prometheusAuth) is reached through a TriggerAuthentication
the user creates: each trigger names it (`authenticationRef`) and KEDA's `authModes`; the operator never
sees the credentials, so it needs no access to Secrets and no KEDA kind beyond ScaledObjects.

The worker's queue is `kembed_worker_queued_tokens{class}` (docs/metrics.md). A PodMonitor scrape gives
each series its pod's `namespace` and `pod` (monitoring/promql.py); a revision's Deployment names its
pods `<model>-worker-<revision>-<pod-template-hash>-<suffix>`, so a regex on `pod` (PromQL anchors it)
keeps exactly that revision's pods of that model. The info join on `revision` would not: two models in
a namespace deploying the same image and settings share a revision.

KEDA hands its trigger's value to an HPA as an AverageValue metric, so the HPA asks for
ceil(queued tokens of all the revision's pods / target) pods: the target is per pod. An autoscaled
Deployment is applied without `replicas` (`with_replicas(body, None)`): the autoscaler owns the field.
"""

from __future__ import annotations

import copy
from typing import Any

from kembed.operator.build import manifests as m
from kembed.operator.build import naming as n
from kembed.operator.build.naming import Owner
from kembed.operator.spec.spec import EmbeddingModelSpec

KEDA_API_VERSION = "keda.sh/v1alpha1"
QUEUE_METRIC = "kembed_worker_queued_tokens"
HELD_METRIC = "kembed_gateway_held_requests"


def queue_query(owner: Owner, revision: str) -> str:
    """Queued tokens of `revision`'s worker pods, both classes, summed: one number (KEDA's Prometheus
    scaler refuses a query that answers several series)."""
    pods = f"{n.workers_name(owner, revision)}-[a-z0-9]+-[a-z0-9]+"
    return f'sum({QUEUE_METRIC}{{namespace="{owner.namespace}", pod=~"{pods}"}})'


def held_query(owner: Owner, spec: EmbeddingModelSpec) -> str:
    """1 while the model's gateway pods hold requests (it has no serving worker), else 0: the demand
    that wakes a model at zero, seen by kembed itself (gateway/service/hold.py). Behind a shared
    endpoint: the endpoint's pods' series of this model (labelled by its served name)."""
    if spec.endpoint:
        pods = f"{n.endpoint_name(spec.endpoint)}-[a-z0-9]+-[a-z0-9]+"
        model = spec.model.served_name or owner.name
        return f'sum({HELD_METRIC}{{namespace="{owner.namespace}", pod=~"{pods}", model="{model}"}}) > bool 0'
    pods = f"{n.gateway_name(owner)}(-bulk)?-[a-z0-9]+-[a-z0-9]+"  # the bulk gateway holds too
    return f'sum({HELD_METRIC}{{namespace="{owner.namespace}", pod=~"{pods}"}}) > bool 0'


def activation_query(spec: EmbeddingModelSpec) -> str:
    """1 while the user's activation signal is above 0, else 0: with a target of 1 per pod it asks for
    one pod at most, so it wakes a revision scaled to zero and never sizes it."""
    return f"sum({spec.autoscaling.activation_query}) > bool 0"


def _prometheus_trigger(name: str, spec: EmbeddingModelSpec, query: str, threshold: int) -> dict[str, Any]:
    a = spec.autoscaling
    # KEDA's ignoreNullValues (default true) reads no series, e.g. pods not yet scraped, as 0.
    metadata = {
        "serverAddress": a.prometheus_address,
        "query": query,
        "threshold": str(threshold),  # every trigger metadata value is a string
    }
    if a.prometheus_namespace:
        metadata["namespace"] = a.prometheus_namespace
    trigger: dict[str, Any] = {"type": "prometheus", "name": name, "metricType": "AverageValue"}
    if a.prometheus_auth is not None:  # the credentials stay in the user's TriggerAuthentication
        metadata["authModes"] = ",".join(dict.fromkeys(a.prometheus_auth.auth_modes))
        ref = a.prometheus_auth.authentication_ref
        trigger["authenticationRef"] = {"name": ref.name, "kind": ref.kind}
    return trigger | {"metadata": metadata}


def scaled_object(owner: Owner, spec: EmbeddingModelSpec, revision: str) -> dict[str, Any]:
    """KEDA's ScaledObject for `revision`'s worker Deployment (same name): its pods scaled on their queue."""
    a = spec.autoscaling
    name = n.workers_name(owner, revision)
    triggers = [
        _prometheus_trigger(
            "queued-tokens", spec, queue_query(owner, revision), a.target_queued_tokens_per_replica
        )
    ]
    if a.scale_to_zero:
        triggers.append(_prometheus_trigger("held-requests", spec, held_query(owner, spec), 1))
        if a.activation_query:
            triggers.append(_prometheus_trigger("activation", spec, activation_query(spec), 1))
    body: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicaCount": a.min_replicas,
        "maxReplicaCount": a.max_replicas,
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_seconds}}
            }
        },
        "triggers": triggers,
    }
    if a.scale_to_zero:  # KEDA's own step from 1 to 0 pods waits cooldownPeriod, not the HPA's window
        body["cooldownPeriod"] = a.scale_down_stabilization_seconds
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": m.metadata(owner, name, "worker", revision),
        "spec": body,
    }


def gateway_autoscaler(owner: Owner, spec: EmbeddingModelSpec) -> dict[str, Any]:
    """An autoscaling/v2 HPA keeping the gateway pods' average CPU at the target share of their request."""
    a = spec.gateway.autoscaling
    name = n.gateway_name(owner)
    target = {"type": "Utilization", "averageUtilization": a.target_cpu_utilization_percent}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": m.metadata(owner, name, "gateway"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": target}}],
        },
    }


def with_replicas(deployment: dict[str, Any], replicas: int | None) -> dict[str, Any]:
    """`deployment` asking for `replicas` pods, or, with None, without the field: applied as a merge
    patch, a body that leaves `replicas` out never changes the live count the autoscaler set."""
    out = copy.deepcopy(deployment)
    if replicas is None:
        out["spec"].pop("replicas", None)
    else:
        out["spec"]["replicas"] = replicas
    return out
