"""The spec sections that protect and place the pods: disruption budgets, topology spread and network
policy (`spec.worker.disruptionBudget`, `spec.{worker,gateway}.topologySpread`, `spec.networkPolicy`).

Part of the `EmbeddingModel` spec (spec.py builds on these); the objects they render are in
`policies.py` and `placement.py`. The validators here twin the CRD's CEL rules (crd.py), so a spec the
API server did not check (a cluster that skips CEL) is refused as InvalidSpec, not rendered into an
object the API server would refuse.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from kembed.operator.spec.spec_base import SpecModel

PERCENT_PATTERN = r"^[0-9]{1,3}%$"
# A count of pods or a percentage of the replicas, as a PodDisruptionBudget takes it: 1 or "25%".
IntOrPercent = (
    Annotated[int, Field(strict=True, ge=0, le=100000)] | Annotated[str, Field(pattern=PERCENT_PATTERN)]
)
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Spread = Literal["ScheduleAnyway", "DoNotSchedule", "Off"]


# --- disruption ---------------------------------------------------------------------------------


class DisruptionBudgetSpec(SpecModel):
    """A PodDisruptionBudget over these pods: how many a voluntary disruption (a node drain, a cluster
    autoscaler scale-down, an eviction) may take at once. A node that fails is not covered."""

    enabled: bool = Field(
        True,
        description="Render the PodDisruptionBudget (one per worker revision; one for the gateway). On by "
        "default: without one a drain may take every pod of a Deployment at once.",
    )
    max_unavailable: IntOrPercent = Field(
        1,
        description="Pods an eviction may leave unavailable, as a count or a percentage of the replicas "
        "('25%', rounded up). 1, the default, works at every size: with 1 replica a drain may evict it "
        "(serving stops until it is rescheduled: run 2 to serve through a drain), where minAvailable: 1 "
        "would block the drain forever; with 2 or more at least one keeps serving. 0 blocks every "
        "eviction: a drain waits until you scale or delete the pods yourself.",
    )
    min_available: IntOrPercent | None = Field(
        None,
        description="Pods that must stay available instead, as a count or a percentage; when set it "
        "replaces maxUnavailable. Unset by default: minAvailable equal to the replicas (1 of 1) blocks "
        "every drain.",
    )


# --- placement ----------------------------------------------------------------------------------


class TopologySpreadSpec(SpecModel):
    """How the pods spread over nodes and zones (topologySpreadConstraints over this component's pods;
    a worker revision's pods are spread among themselves). Only nodes the pods may run on count
    (nodeSelector, affinity and taints are honoured)."""

    nodes: Spread = Field(
        "ScheduleAnyway",
        description="Across nodes (kubernetes.io/hostname). ScheduleAnyway: the scheduler prefers a node "
        "with fewer of these pods but places a pod anyway; DoNotSchedule: a pod stays Pending rather "
        "than exceed maxSkew (one GPU node down can then leave a worker unscheduled); Off: no constraint. "
        "ScheduleAnyway by default: one node losing all replicas is the common outage, and a soft rule "
        "never blocks scheduling.",
    )
    zones: Spread = Field(
        "ScheduleAnyway",
        description="Across zones (topology.kubernetes.io/zone), with the same choices. With DoNotSchedule "
        "nodes without the zone label are not candidates at all, so use it only where every node carries "
        "one. ScheduleAnyway by default: a cluster without zones is unaffected.",
    )
    max_skew: int = Field(
        1,
        ge=1,
        le=64,
        description="Most pods one node (or zone) may hold beyond the emptiest one; 1 is an even spread.",
    )


# --- network policy -----------------------------------------------------------------------------


class LabelSelectorRequirement(SpecModel):
    """One expression of a label selector, as in Kubernetes."""

    key: str = Field(min_length=1, max_length=317, description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn (values needed), Exists or DoesNotExist (no values)."
    )
    values: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list, max_length=64, description="Label values for In and NotIn."
    )

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> LabelSelectorRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise ValueError("In and NotIn need values; Exists and DoesNotExist take none")
        return self


class LabelSelector(SpecModel):
    """A label selector, as in Kubernetes; an empty one selects everything."""

    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels that must all match.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=16, description="Expressions that must all hold."
    )


class IpBlock(SpecModel):
    """A range of addresses, as in a NetworkPolicy's ipBlock."""

    cidr: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$",
        description="Addresses allowed, e.g. 10.0.0.0/8 or 2001:db8::/32.",
    )
    except_: list[Annotated[str, Field(max_length=64, pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$")]] = Field(
        default_factory=list, alias="except", max_length=32, description="Ranges within cidr left out."
    )

    @field_validator("cidr")
    @classmethod
    def _is_cidr(cls, value: str) -> str:
        ipaddress.ip_network(value, strict=False)  # ValueError on a bad one
        return value

    @field_validator("except_")
    @classmethod
    def _are_cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value


class NetworkPeer(SpecModel):
    """Who may connect, as a NetworkPolicy peer: pods chosen by namespace and/or pod labels, or an
    address range. Pod labels alone mean pods in this model's namespace."""

    namespace_selector: LabelSelector | None = Field(
        None, description="Namespaces by label ({} is every namespace; by name: kubernetes.io/metadata.name)."
    )
    pod_selector: LabelSelector | None = Field(
        None,
        description="Pods by label, in the namespaces namespaceSelector picks (this namespace without one).",
    )
    ip_block: IpBlock | None = Field(
        None,
        description="Addresses outside the pod network, e.g. a load balancer's or a VPN's; alone in its "
        "peer. Node and load-balancer traffic arrives with the source addresses your CNI and "
        "externalTrafficPolicy leave it.",
    )

    @model_validator(mode="after")
    def _one_kind_of_peer(self) -> NetworkPeer:
        has_selector = self.namespace_selector is not None or self.pod_selector is not None
        if has_selector == (self.ip_block is not None):
            raise ValueError("a peer is either ipBlock or namespaceSelector/podSelector, and one is needed")
        return self


class NetworkPolicySpec(SpecModel):
    """NetworkPolicies for the model's pods (ingress only; egress stays open). Worker pods take their
    gRPC and data ports only from this model's gateway pods and its prewarm and smoke Jobs, and their
    metrics port only from metricsNamespaces; the gateway takes HTTP from gatewayFrom. Enforced only
    where the cluster's network plugin implements NetworkPolicy; the kubelet's probes are never
    subject to them."""

    enabled: bool = Field(
        True,
        description="Render the two NetworkPolicies (<model>-worker, <model>-gateway). On by default: the "
        "workers' ports carry embeddings and, without worker.authTokenSecretRef, no authentication, so "
        "nothing but this model's gateway and Jobs should reach them.",
    )
    gateway_from: list[NetworkPeer] = Field(
        default_factory=list,
        max_length=64,
        description="Who may reach the gateway's HTTP port (its API and /metrics); empty (the default) "
        "means everyone, as a Service is usually reached through an Ingress or a load balancer. When "
        "set, the metricsNamespaces are added, if any, so Prometheus keeps scraping.",
    )
    metrics_namespaces: list[Annotated[str, Field(max_length=63, pattern=DNS_LABEL)]] = Field(
        default_factory=list,
        max_length=64,
        description="Namespaces (by name) whose pods may scrape the workers' metrics port (9091); empty "
        "(the default) means pods of every namespace, since where Prometheus runs differs per cluster. "
        "Set it to Prometheus' namespace (e.g. monitoring) to close the port to the rest.",
    )
