"""Pure builders of what guards a model's pods: PodDisruptionBudgets (one per worker revision, named
like its Deployment, and one per gateway) and NetworkPolicies (`<model>-worker` over every worker
pod of the model, all revisions; `<model>-gateway`; `<model>-gateway-bulk` with the bulk gateway).
Owned and labelled like everything else (manifests.metadata), so the garbage collector removes them
with the model.

Who reaches a worker: the model's gateway pods, the bulk gateway's too (gRPC and the data port), and
its prewarm and smoke Job pods (gRPC, against candidate pods and, for hot buckets, the serving
revision's). The operator itself never dials gRPC: it leaves that to the Jobs. It reads the serving
workers' bucket hits from their metrics port for the hot list (hot_buckets.py), so its namespace is
admitted there with the metricsNamespaces. The kubelet's gRPC and HTTP probes come from the node and
are not subject to NetworkPolicy.
Ports are named (grpc, data, metrics, http), so a policy holds for every revision even when
`worker.port` differs between them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kembed.operator.build import manifests as m
from kembed.operator.build import naming as n
from kembed.operator.build.naming import Owner
from kembed.operator.spec.policy_spec import DisruptionBudgetSpec, LabelSelector, NetworkPeer
from kembed.operator.spec.spec import EmbeddingModelSpec

ROLLOUT_JOB_KINDS = ("prewarm", "smoke")  # the Job pods' component labels (jobs.py)
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server


# --- disruption budgets -------------------------------------------------------------------------


def _budget(
    owner: Owner, budget: DisruptionBudgetSpec, name: str, component: str, revision: str | None = None
) -> dict[str, Any]:
    limit = (
        {"minAvailable": budget.min_available}
        if budget.min_available is not None
        else {"maxUnavailable": budget.max_unavailable}
    )
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": m.metadata(owner, name, component, revision),
        "spec": {
            "selector": {"matchLabels": n.selector(owner, component, revision)},
            **limit,
            # A pod that is not ready (crash-looping, or a worker still loading weights and capturing
            # graphs) serves nothing: evicting it costs nothing, and counting it would let one broken
            # pod hold a node drain up forever.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def worker_disruption_budget(owner: Owner, spec: EmbeddingModelSpec, revision: str) -> dict[str, Any]:
    """The budget of one revision's workers (each revision is its own Deployment)."""
    return _budget(owner, spec.worker.disruption_budget, n.workers_name(owner, revision), "worker", revision)


def gateway_disruption_budget(
    owner: Owner, spec: EmbeddingModelSpec, component: str = "gateway"
) -> dict[str, Any]:
    """The gateway's budget; with n.BULK_GATEWAY the bulk gateway's, from gateway.disruptionBudget too."""
    name = n.gateway_name(owner, component)
    return _budget(owner, spec.gateway.disruption_budget, name, component)


def disruption_budgets(
    owner: Owner, spec: EmbeddingModelSpec, revisions: Iterable[str]
) -> list[dict[str, Any]]:
    """Every budget the spec wants, for the worker `revisions` kept: none where a budget is disabled."""
    out = []
    if spec.worker.disruption_budget.enabled:
        out += [worker_disruption_budget(owner, spec, revision) for revision in sorted(revisions)]
    if spec.gateway.disruption_budget.enabled:
        out += [gateway_disruption_budget(owner, spec, c) for c in m.gateway_components(spec)]
    return out


# --- network policies ---------------------------------------------------------------------------


def label_selector(selector: LabelSelector) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if selector.match_labels:
        out["matchLabels"] = dict(sorted(selector.match_labels.items()))
    if selector.match_expressions:
        out["matchExpressions"] = [
            {"key": e.key, "operator": e.operator} | ({"values": list(e.values)} if e.values else {})
            for e in selector.match_expressions
        ]
    return out


def peer(spec_peer: NetworkPeer) -> dict[str, Any]:
    if spec_peer.ip_block is not None:
        block: dict[str, Any] = {"cidr": spec_peer.ip_block.cidr}
        if spec_peer.ip_block.except_:
            block["except"] = list(spec_peer.ip_block.except_)
        return {"ipBlock": block}
    out = {}
    if spec_peer.namespace_selector is not None:
        out["namespaceSelector"] = label_selector(spec_peer.namespace_selector)
    if spec_peer.pod_selector is not None:
        out["podSelector"] = label_selector(spec_peer.pod_selector)
    return out


def metrics_peers(spec: EmbeddingModelSpec, also: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Pods of the namespaces named in metricsNamespaces (and `also`); of every namespace when it is
    empty."""
    names = spec.network_policy.metrics_namespaces
    if not names:
        return [{"namespaceSelector": {}}]
    values = sorted(set(names) | {name for name in also if name})
    expression = {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": values}
    return [{"namespaceSelector": {"matchExpressions": [expression]}}]


def _tcp(*names: str) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": name} for name in names]


def _policy(owner: Owner, component: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": m.metadata(owner, n.network_policy_name(owner, component), component),
        "spec": {
            "podSelector": {"matchLabels": n.selector(owner, component)},
            "policyTypes": ["Ingress"],  # egress stays open: the pods only answer and pull images
            "ingress": ingress,
        },
    }


def worker_network_policy(
    owner: Owner, spec: EmbeddingModelSpec, operator_namespace: str = ""
) -> dict[str, Any]:
    """Every worker pod of the model: gRPC and data from its gateway and rollout Job pods (same
    namespace, selected by the labels the operator gives them), metrics from metricsNamespaces and
    the operator's namespace (it reads the hot list there)."""
    clients = [
        {"podSelector": {"matchLabels": n.selector(owner, component)}}
        for component in (*m.gateway_components(spec), *ROLLOUT_JOB_KINDS)
    ]
    if spec.endpoint:  # the shared endpoint's gateway pods send this model's work
        clients.insert(0, {"podSelector": {"matchLabels": n.endpoint_selector(spec.endpoint)}})
    return _policy(
        owner,
        "worker",
        [
            {"from": clients, "ports": _tcp("grpc", "data")},
            {"from": metrics_peers(spec, also=[operator_namespace]), "ports": _tcp("metrics")},
        ],
    )


def gateway_network_policy(
    owner: Owner, spec: EmbeddingModelSpec, component: str = "gateway"
) -> dict[str, Any]:
    """The gateway pods (or, with n.BULK_GATEWAY, the bulk gateway's): HTTP (the API and /metrics)
    from everyone, or only from gatewayFrom plus the metricsNamespaces, when it is set."""
    rule: dict[str, Any] = {"ports": _tcp("http")}
    allowed = spec.network_policy.gateway_from
    if allowed:  # no `from` at all admits every source, inside the cluster and out
        scrapers = metrics_peers(spec) if spec.network_policy.metrics_namespaces else []
        rule["from"] = [peer(p) for p in allowed] + scrapers
    return _policy(owner, component, [rule])


def network_policies(
    owner: Owner, spec: EmbeddingModelSpec, operator_namespace: str = ""
) -> list[dict[str, Any]]:
    """The policies the spec wants: the workers' and one per gateway, or none when
    spec.networkPolicy.enabled is off. `operator_namespace` is where the operator runs (its settings;
    empty if unknown)."""
    if not spec.network_policy.enabled:
        return []
    gateways = [gateway_network_policy(owner, spec, c) for c in m.gateway_components(spec)]
    return [worker_network_policy(owner, spec, operator_namespace), *gateways]
