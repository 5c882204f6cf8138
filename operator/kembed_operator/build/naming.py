"""Names and labels of everything the operator creates for one EmbeddingModel.

Names are `<model>-<role>[-<revision>][-<attempt>]`; the CRD caps model names at 40 characters so the
longest (a Job, whose name is also a pod label) stays within 63. Selectors use `kembed.dev/*` labels,
which only the operator sets; the `app.kubernetes.io/*` ones are the standard, informational set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kembed.operator.spec.spec import GROUP, KIND, VERSION

MODEL_LABEL = "kembed.dev/model"
REVISION_LABEL = "kembed.dev/revision"
COMPONENT_LABEL = "app.kubernetes.io/component"
ATTEMPT_LABEL = "kembed.dev/attempt"
MANAGED_BY = "kembed-operator"
# The component label of the bulk gateway's objects (trafficClasses.bulkGateway): not `gateway`, so
# the main gateway's selectors never pick its pods, nor its selectors the main gateway's.
BULK_GATEWAY = "gateway-bulk"
# A shared endpoint (spec.endpoint): its gateway's pods carry the endpoint's name, not a model's.
ENDPOINT_LABEL = "kembed.dev/endpoint"
ENDPOINT = "endpoint"  # the component label of the endpoint's gateway Deployment, pods and Service
ENDPOINT_ENTRY = "endpoint-entry"  # the component label of a model's part of it (a ConfigMap)


@dataclass(frozen=True)
class Owner:
    """The EmbeddingModel everything is made for."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def gateway_name(owner: Owner, component: str = "gateway") -> str:
    """The gateway's Deployment, Service, budget, policy and monitor; with component BULK_GATEWAY the
    bulk gateway's (`<model>-gateway-bulk`)."""
    return f"{owner.name}-{component}"


def endpoint_name(endpoint: str) -> str:
    """A shared endpoint's gateway Deployment and Service (`<endpoint>-endpoint`)."""
    return f"{endpoint}-{ENDPOINT}"


def endpoint_entry_name(owner: Owner) -> str:
    """The ConfigMap holding a model's part of its shared endpoint."""
    return f"{owner.name}-{ENDPOINT_ENTRY}"


def endpoint_selector(endpoint: str) -> dict[str, str]:
    return {ENDPOINT_LABEL: endpoint, COMPONENT_LABEL: ENDPOINT}


def endpoint_revision_key(model: str) -> str:
    """The endpoint pod template's annotation naming the revision it sends a model's work to."""
    return f"revision.kembed.dev/{model}"


def workers_name(owner: Owner, revision: str) -> str:
    """The worker Deployment, its headless Service and PodDisruptionBudget (same name) of one revision."""
    return f"{owner.name}-worker-{revision}"


def engine_config_name(owner: Owner, revision: str) -> str:
    return f"{owner.name}-engine-{revision}"


def hot_buckets_name(owner: Owner) -> str:
    """The model's hot list (hot_buckets.py): one for all its revisions, read by every worker pod."""
    return f"{owner.name}-hot-buckets"


def network_policy_name(owner: Owner, component: str) -> str:
    """The NetworkPolicy over a component's pods (worker: every revision; gateway)."""
    return f"{owner.name}-{component}"


def job_name(owner: Owner, kind: str, revision: str, attempt: int) -> str:
    """`kind` is prewarm, smoke or golden."""
    return f"{owner.name}-{kind}-{revision}-{attempt}"


def selector(owner: Owner, component: str, revision: str | None = None) -> dict[str, str]:
    labels = {MODEL_LABEL: owner.name, COMPONENT_LABEL: component}
    if revision is not None:
        labels[REVISION_LABEL] = revision
    return labels


def labels(owner: Owner, component: str, revision: str | None = None) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "kembed",
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/part-of": "kembed",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        **selector(owner, component, revision),
    }


def selector_string(labels_: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels_.items()))
