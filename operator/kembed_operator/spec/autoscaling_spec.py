"""The spec sections that size the pods by load: `spec.autoscaling` (KEDA on the workers' queued
tokens, from a Prometheus with or without authentication) and `spec.gateway.autoscaling` (an HPA on
the gateway's CPU).

Part of the `EmbeddingModel` spec (spec.py builds on these); the objects they render are in
`autoscaling.py`. The validators here twin the CRD's CEL rules (crd.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kembed.operator.spec.spec_base import SpecModel


class GatewayAutoscalingSpec(SpecModel):
    """Gateway pods set by a HorizontalPodAutoscaler (autoscaling/v2) on their CPU use, instead of
    gateway.replicas. Tokenization is CPU-bound, so CPU is the gateway's load."""

    enabled: bool = Field(
        False,
        description="Scale the gateway Deployment on CPU with a HorizontalPodAutoscaler named like it. "
        "Off by default: gateway.replicas fixes the count. On: the operator leaves the Deployment's "
        "replicas to the autoscaler and gateway.replicas is ignored. Needs the cluster's metrics API "
        "(metrics-server).",
    )
    min_replicas: int = Field(
        2,
        ge=1,
        le=256,
        description="Fewest gateway pods; 2 so that a rolling switch between revisions or a node drain "
        "never leaves none.",
    )
    max_replicas: int = Field(8, ge=1, le=256, description="Most gateway pods; at least minReplicas.")
    target_cpu_utilization_percent: int = Field(
        70,
        ge=10,
        le=200,
        description="Average CPU use the autoscaler keeps, in percent of the pods' CPU request "
        "(gateway.resources.requests.cpu), from 10 to 200. 70: the headroom absorbs a burst for the "
        "seconds a new pod takes to become ready, before requests queue on saturated cores.",
    )

    @model_validator(mode="after")
    def _min_within_max(self) -> GatewayAutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must not exceed maxReplicas")
        return self


class AuthenticationRef(SpecModel):
    """A KEDA TriggerAuthentication (in the model's namespace) or ClusterTriggerAuthentication."""

    name: str = Field(
        min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="Its name."
    )
    kind: Literal["TriggerAuthentication", "ClusterTriggerAuthentication"] = Field(
        "TriggerAuthentication",
        description="TriggerAuthentication (the default: in the model's namespace) or "
        "ClusterTriggerAuthentication (one for every namespace, e.g. a platform's shared Prometheus "
        "credentials).",
    )


class PrometheusAuthSpec(SpecModel):
    """How KEDA authenticates to an authenticated Prometheus (Thanos Querier, OpenShift's monitoring,
    a proxy in front): the authModes of KEDA's Prometheus scaler, and the TriggerAuthentication you
    create that holds the credentials they need (from a Secret, a bound service account token, a pod
    identity, Vault: whatever KEDA supports). The operator only names it: it reads no Secret."""

    auth_modes: list[Literal["bearer", "basic", "tls", "custom"]] = Field(
        min_length=1,
        max_length=4,
        description="KEDA's authModes: bearer (parameter bearerToken), basic (username, password), tls "
        "(cert, key; ca), custom (customAuthHeader, customAuthValue). The TriggerAuthentication must "
        "provide the parameters of each mode named.",
    )
    authentication_ref: AuthenticationRef = Field(
        description="The TriggerAuthentication or ClusterTriggerAuthentication both triggers use."
    )


class AutoscalingSpec(SpecModel):
    """Worker pods of the serving revision set by KEDA from the workers' own queues, instead of
    worker.replicas: a ScaledObject (keda.sh/v1alpha1) per serving revision with a Prometheus trigger
    on that revision's kembed_worker_queued_tokens. Needs KEDA in the cluster and a Prometheus that
    scrapes the worker pods (metrics.serviceMonitor, or a scrape of your own keeping the pod and
    namespace labels)."""

    enabled: bool = Field(
        False,
        description="Scale the serving revision's workers with KEDA. Off by default: it needs KEDA and a "
        "Prometheus the cluster may not have. On: the operator leaves the serving worker Deployment's "
        "replicas to the autoscaler, worker.replicas is ignored, and a rollout starts its candidate at "
        "the serving revision's current count.",
    )
    min_replicas: int = Field(
        1,
        ge=0,
        le=1024,
        description="Fewest worker pods of the serving revision. 1: a query never waits for a pod to "
        "load its weights and prewarm its CUDA graphs (minutes). 0 only together with scaleToZero.",
    )
    max_replicas: int = Field(
        4,
        ge=1,
        le=1024,
        description="Most worker pods of the serving revision, at least minReplicas: a bound on the GPUs "
        "a burst can claim (one per pod by default). Raise it to what the GPU quota allows.",
    )
    target_queued_tokens_per_replica: int = Field(
        8192,
        ge=1,
        description="Queued tokens per worker pod the autoscaler aims at, in tokens: desired pods = "
        "ceil(queued tokens of the revision's pods, both classes, summed / this). 8192 is four full "
        "batches at the default worker.maxBatchTokens (2048) and an eighth of the default "
        "worker.maxQueuedTokens (65536): pods are added while a request waits a few batches, long "
        "before the workers refuse work. Must be below worker.maxQueuedTokens: a worker never queues "
        "more, so a higher target would never be reached.",
    )
    scale_down_stabilization_seconds: int = Field(
        300,
        ge=0,
        le=3600,
        description="How long the load must stay low before worker pods are removed, in seconds, from 0 "
        "to 3600: the HPA's scaleDown.stabilizationWindowSeconds, and with scaleToZero KEDA's "
        "cooldownPeriod before the last pod goes. 300, the HPA's own default: a new worker pod takes "
        "minutes to load and prewarm, so one removed on a short lull and started again costs more "
        "than it saves.",
    )
    scale_to_zero: bool = Field(
        False,
        description="Allow minReplicas 0 (and require it): the serving revision's last pod goes after "
        "scaleDownStabilizationSeconds without queued work, held requests or activation signal. At "
        "zero the gateway stays ready and holds the model's requests (maxHeldRequests, "
        "wakeTimeoutSeconds); the held requests are the signal that wakes one pod "
        "(kembed_gateway_held_requests, a KEDA trigger of its own), and they are answered once it "
        "serves: the first request after a quiet hour waits for a pod to start, load and self-check. "
        "Off by default.",
    )
    max_held_requests: int = Field(
        256,
        ge=1,
        le=65536,
        description="With scaleToZero: requests each gateway pod holds while the model has no serving "
        "worker, until one serves; one more is answered 503 with Retry-After at once. 256: a burst "
        "of queries after a quiet hour, each body at most gateway.maxRequestBytes (held bodies are "
        "also capped at 64 MiB a pod).",
    )
    wake_timeout_seconds: int = Field(
        300,
        ge=1,
        le=3600,
        description="With scaleToZero: longest a request is held for a worker to serve, in seconds; "
        "503 with Retry-After after. 300: a GPU node may have to be provisioned and the worker "
        "image pulled before the pod loads its model and passes its self-check.",
    )
    activation_query: str = Field(
        "",
        max_length=4096,
        description="PromQL whose value above 0 keeps (or wakes) at least one worker pod, beside the "
        "requests the gateway holds, e.g. an indexing queue's length, to wake the model before its "
        "first request; summed over its series. Optional with scaleToZero (a KEDA trigger of its "
        "own); unused otherwise.",
    )
    prometheus_address: str = Field(
        "",
        pattern=r"^(https?://\S+)?$",
        description="URL of the Prometheus server the KEDA trigger queries (its serverAddress), e.g. "
        "http://prometheus-operated.monitoring.svc:9090, reachable from KEDA's operator; without "
        "prometheusAuth, without authentication. Required when enabled.",
    )
    prometheus_auth: PrometheusAuthSpec | None = Field(
        None,
        description="Credentials for a Prometheus that asks for them: KEDA's authModes and a "
        "TriggerAuthentication holding them. Unset (the default): KEDA queries without authentication.",
    )
    prometheus_namespace: str = Field(
        "",
        max_length=63,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
        description="KEDA's namespace parameter: queries go to the Prometheus API as namespaced ones, "
        "as Thanos Querier's tenancy port requires (OpenShift's user-workload monitoring on "
        "thanos-querier.openshift-monitoring.svc:9092, with a bearer token allowed to view the "
        "namespace's metrics). Empty (the default): not sent.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must not exceed maxReplicas")
        if (self.min_replicas == 0) != self.scale_to_zero:
            raise ValueError("minReplicas 0 needs scaleToZero: true, and scaleToZero needs minReplicas 0")
        if self.enabled and not self.prometheus_address:
            raise ValueError("autoscaling needs prometheusAddress: the Prometheus KEDA queries")
        return self
