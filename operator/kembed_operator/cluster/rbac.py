"""Exactly the API access the operator uses: the chart's Role is rendered from (and tested against)
these rules, and the reconcile tests fail if the operator makes a call they do not cover.

`KINDS` maps the kinds `reconcile` touches to their API group, version and resource.
"""

from __future__ import annotations

from kembed.operator.spec.spec import GROUP, PLURAL

KINDS: dict[str, tuple[str, str, str]] = {
    "Deployment": ("apps", "v1", "deployments"),
    "Service": ("", "v1", "services"),
    "ConfigMap": ("", "v1", "configmaps"),
    "Job": ("batch", "v1", "jobs"),
    "Pod": ("", "v1", "pods"),
    "PodLog": ("", "v1", "pods/log"),  # a pod's log, the subresource (`Cluster.pod_log`)
    "Event": ("", "v1", "events"),
    "ServiceMonitor": ("monitoring.coreos.com", "v1", "servicemonitors"),
    "PodMonitor": ("monitoring.coreos.com", "v1", "podmonitors"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
    "ScaledObject": ("keda.sh", "v1alpha1", "scaledobjects"),
    "HorizontalPodAutoscaler": ("autoscaling", "v2", "horizontalpodautoscalers"),
}

# Namespaced rules: a Role in each watched namespace, or a ClusterRole when watching all of them.
RBAC_RULES: list[dict[str, list[str]]] = [
    # kopf lists and watches the models, and patches them (its own annotations) and their status.
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch"]},
    # Owner references with blockOwnerDeletion need update on the owner's finalizers.
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/finalizers"], "verbs": ["update"]},
    {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "verbs": ["get", "list", "create", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create", "patch", "delete"]},
    # list: the model's golden records (golden.py), by its label.
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "patch", "delete"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "create", "delete"]},
    # Ready worker pods' addresses (the Jobs' targets) and failed Job pods' reports.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    # The golden Job's answer: one record line in its log (golden.py says why not elsewhere).
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # Per worker revision and gateway; listed by the model's label to delete the ones no longer wanted.
    {
        "apiGroups": ["policy"],
        "resources": ["poddisruptionbudgets"],
        "verbs": ["get", "list", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "list", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["monitoring.coreos.com"],
        "resources": ["servicemonitors", "podmonitors"],
        "verbs": ["get", "create", "patch", "delete"],
    },
    # spec.autoscaling: the serving revision's ScaledObject; list finds those of retired revisions.
    {
        "apiGroups": ["keda.sh"],
        "resources": ["scaledobjects"],
        "verbs": ["get", "list", "create", "patch", "delete"],
    },
    # spec.gateway.autoscaling: the gateway's CPU autoscaler.
    {
        "apiGroups": ["autoscaling"],
        "resources": ["horizontalpodautoscalers"],
        "verbs": ["get", "create", "patch", "delete"],
    },
]

# Cluster-scoped reads kopf makes at start when it watches every namespace (ClusterRole only).
CLUSTER_RBAC_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["list", "watch"],
    },
]


def allows(verb: str, kind: str) -> bool:
    """Whether RBAC_RULES grant `verb` on the resource of `kind`."""
    group, _, resource = KINDS[kind]
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in RBAC_RULES
    )
