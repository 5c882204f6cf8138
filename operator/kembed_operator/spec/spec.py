"""The typed `EmbeddingModel` (kembed.dev/v1alpha1) spec, the one source of the CRD schema (the status
is in status.py; the model's section in model_spec.py; those on disruption, placement and network
policy in policy_spec.py; the pod settings worker and gateway share in pod_spec.py).

Every field carries a description with its unit and why its default is what it is: `crd.py` turns
these models into the openAPIV3Schema, so `kubectl explain em.spec.worker` reads the same text.
Field names are snake_case here and camelCase on the wire (aliases). Engine and gateway defaults
mirror `WorkerConfig` and `GatewayConfig` (copied, not imported: the operator imports neither).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from kembed.operator.spec.autoscaling_spec import AutoscalingSpec, GatewayAutoscalingSpec
from kembed.operator.spec.edge_spec import ConnectionLimitsSpec
from kembed.operator.spec.model_spec import ModelSpec
from kembed.operator.spec.pod_spec import PodSettings
from kembed.operator.spec.policy_spec import DisruptionBudgetSpec, NetworkPolicySpec, TopologySpreadSpec
from kembed.operator.spec.spec_base import SpecModel
from kembed.operator.spec.traffic_spec import TrafficClassesSpec
from kembed.proto.accuracy import MIN_COSINE

GROUP = "kembed.dev"
VERSION = "v1alpha1"
KIND = "EmbeddingModel"
PLURAL = "embeddingmodels"
SHORT_NAMES = ("em",)

BUCKET_PATTERN = r"^[1-9][0-9]*x[1-9][0-9]*$"
Quantity = int | str  # a Kubernetes resource quantity: 2, "500m", "16Gi"
Bucket = Annotated[str, Field(pattern=BUCKET_PATTERN)]  # SEQUENCESxTOKENS, e.g. 8x512
PRIORITY_CLASS_PATTERN = r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # empty, or a DNS subdomain
GPU_RESOURCE = "nvidia.com/gpu"  # a whole GPU, or a MIG slice under the device plugin's single strategy
MIG_PREFIX = "nvidia.com/mig-"  # a MIG slice under the mixed strategy, e.g. nvidia.com/mig-1g.10gb
GPU_LIMIT_MESSAGE = (
    "device cuda needs a GPU limit in resources.limits: nvidia.com/gpu, or a MIG slice such as "
    "nvidia.com/mig-1g.10gb"
)


def is_gpu_resource(name: str) -> bool:
    """Whether a resource name is an NVIDIA GPU or a MIG slice of one."""
    return name == GPU_RESOURCE or name.startswith(MIG_PREFIX)


# --- worker -------------------------------------------------------------------------------------


class Resources(SpecModel):
    """Container resources, as in a Pod (quantities like 2, 500m, 16Gi)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Resources the scheduler reserves."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Hard caps; GPUs are requested here: nvidia.com/gpu, or a MIG slice "
        "(nvidia.com/mig-1g.10gb: 1 under the NVIDIA device plugin's mixed strategy).",
    )


class TokenSecretRef(SpecModel):
    """A key of a Secret in this namespace holding the workers' shared token."""

    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field("token", min_length=1, description="Key within the Secret.")


class WorkerSpec(PodSettings):
    """The GPU workers: one Deployment per revision, each pod one worker process (one GPU, or one MIG
    slice). The pod settings it shares with the gateway (pull secrets, service account, runtime class,
    env, pod labels and annotations, placement, security context) are PodSettings' (pod_spec.py)."""

    image: str = Field(
        "",
        description="Worker image; empty means the operator's default worker image "
        "(its setting KEMBED_OPERATOR_WORKER_IMAGE). Part of the revision.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls the worker image."
    )
    replicas: int = Field(
        1,
        ge=0,
        le=1024,
        description="Worker pods of the serving revision. Scaling "
        "is not a new revision: it never triggers a rollout.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the model runs: auto picks cuda when the pod sees a GPU."
    )
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests={"cpu": "2", "memory": "8Gi"}, limits={"memory": "16Gi", "nvidia.com/gpu": 1}
        ),
        description="Container resources. Default: one GPU, 2 CPUs (tokenization is the gateway's job, "
        "the worker only packs batches), 8-16 GiB of host memory for weights and pinned buffers.",
    )
    attention_backend: Literal[
        "auto", "sdpa", "sdpa-padded", "torch-varlen", "flash-attn", "flashinfer", "triton"
    ] = Field(
        "auto",
        description="Ragged attention kernel: auto times the installed GPU kernels (torch-varlen, "
        "flash-attn = FlashAttention 4 on Hopper/Blackwell, triton = kembed's own Triton "
        "kernel, and flashinfer when its kernels are already built) at start and picks per "
        "batch size; sdpa is the CPU one. flashinfer is "
        "not in the default worker image (an image with the [flashinfer] extra and nvcc compiles "
        "its kernels on first use, minutes, unless it ships them).",
    )
    max_batch_tokens: int = Field(
        2048,
        ge=1,
        description="Token budget of one forward pass, in tokens. On an H200 a sub-1B "
        "model reaches ~90% of its plateau throughput at 2048 and ~97% at 4096; "
        "a query queued behind a full batch waits for it.",
    )
    max_queued_tokens: int = Field(
        65536,
        ge=1,
        description="Admission cap in tokens admitted and not yet "
        "answered; past it the worker refuses at once so the gateway retries "
        "elsewhere (32 full batches of backlog).",
    )
    max_batch_sequences: int = Field(
        256,
        ge=1,
        le=4096,
        description="Most sequences in one batch and the largest sequence-count bucket of the CUDA graphs.",
    )
    max_inflight_batches: int = Field(
        2,
        ge=1,
        le=16,
        description="Batches launched and not yet collected; 2 lets the CPU pack batch N+1 while N runs.",
    )
    cuda_graphs: bool = Field(
        True,
        description="Capture whole-model CUDA graphs per bucket (at pod start, see graphs.startupPrewarm; "
        "the prewarm Job captures the hot buckets again at rollout).",
    )
    max_graphs: int = Field(
        1024,
        ge=0,
        le=4096,
        description="Cap on resident CUDA graphs; past it new buckets run eagerly. 1024 holds every "
        "bucket a batch can land in with the default batch limits (about 200 for an 8k-token model, "
        "300 for a 32k one), so a start-up prewarm of all is not cut short by it.",
    )
    max_pinned_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description="Hard cap on pinned host memory for "
        "in-flight batches, in bytes (default 256 MiB); when full, launches wait.",
    )
    num_threads: int = Field(
        0, ge=0, le=512, description="torch intra-op threads on CPU; 0 keeps torch's default (one per core)."
    )
    port: int = Field(
        50051, ge=1, le=65535, description="gRPC port of the worker (the conventional gRPC default)."
    )
    priority_class_name: str = Field(
        "",
        max_length=253,
        pattern=PRIORITY_CLASS_PATTERN,
        description="PriorityClass of the worker pods; empty (the default) leaves the cluster's default "
        "priority. A high class lets a worker preempt batch pods for its GPU and keeps it from being "
        "preempted. Part of the revision when set.",
    )
    topology_spread: TopologySpreadSpec = Field(
        default_factory=TopologySpreadSpec,
        description="How a revision's worker pods spread over nodes and zones; soft (ScheduleAnyway) by "
        "default. Part of the revision when not at its defaults.",
    )
    disruption_budget: DisruptionBudgetSpec = Field(
        default_factory=DisruptionBudgetSpec,
        description="The PodDisruptionBudget of each worker revision (default maxUnavailable: 1: a drain "
        "takes one worker at a time). Not part of the revision: a change updates the budgets in place.",
    )
    auth_token_secret_ref: TokenSecretRef | None = Field(
        None,
        description="Secret key holding a shared token the workers require on every call but their "
        "health checks (gRPC metadata `authorization: Bearer <token>`; on the data port, a first frame). "
        "Given to the workers (KEMBED_WORKER_AUTH_TOKEN), the gateway and the prewarm and smoke Jobs. "
        "Part of the revision: setting or changing it rolls the workers out through the gates.",
    )
    kernel_cache_claim: str = Field(
        "",
        max_length=253,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
        description="PersistentVolumeClaim (in the model's namespace) where worker pods keep the GPU "
        "kernels they compile: FlashAttention 4's and Triton's, 1.5-3 s each, compiled again by every "
        "new pod otherwise. Its key includes the library's sources and versions, so pods of any "
        "revision share it; with more than one pod, use a ReadWriteMany claim. Empty (the default): "
        "the pod's own /tmp, which a restarted container keeps but a new pod does not. Part of the "
        "revision when set.",
    )
    stall_restart_seconds: int = Field(
        60,
        ge=10,
        le=3600,
        description="Seconds a worker may stay stalled before its liveness probe restarts it, rounded "
        "up to the probe's 10 s period. A worker is stalled when a device step runs far past what steps "
        "of its size take (it then answers its health checks NOT_SERVING: gateways move its work "
        "within about a second, and its pod leaves the Service) or when it stops answering them at all "
        "(a wedged process). Part of the revision when set away from 60.",
    )

    @model_validator(mode="after")
    def _a_batch_fits_the_queue(self) -> WorkerSpec:
        if self.max_batch_tokens > self.max_queued_tokens:
            raise ValueError("maxBatchTokens must not exceed maxQueuedTokens: one batch must fit the queue")
        return self

    @model_validator(mode="after")
    def _a_gpu_for_cuda(self) -> WorkerSpec:
        if self.device == "cuda" and not any(map(is_gpu_resource, self.resources.limits)):
            raise ValueError(GPU_LIMIT_MESSAGE)
        return self


# --- gateway ------------------------------------------------------------------------------------


class SecretKeyRef(SpecModel):
    """A key of a Secret in this namespace."""

    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field("api-key", min_length=1, description="Key within the Secret.")


class ServiceSpec(SpecModel):
    """How the gateway is exposed."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        "ClusterIP", description="Service type; ClusterIP keeps it in-cluster (put an Ingress in front)."
    )
    port: int = Field(80, ge=1, le=65535, description="Service port clients use (HTTP).")


class GatewaySpec(PodSettings):
    """The HTTP gateway: tokenization, chunking and balancing over the serving revision's workers. Its
    pod settings (pull secrets, service account, runtime class, env, pod labels and annotations,
    placement, security context) are PodSettings' (pod_spec.py); a change to them rolls the gateway."""

    image: str = Field(
        "",
        description="Gateway image; empty means the operator's default gateway image "
        "(KEMBED_OPERATOR_GATEWAY_IMAGE).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls the gateway image."
    )
    replicas: int = Field(
        2,
        ge=1,
        le=256,
        description="Gateway pods; 2 so a rolling switch between "
        "revisions or a node drain never leaves none.",
    )
    resources: Resources = Field(
        default_factory=lambda: Resources(requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "2Gi"}),
        description="Container resources. Tokenization is CPU-bound: give it cores, not GPUs.",
    )
    service: ServiceSpec = Field(default_factory=ServiceSpec, description="The gateway Service.")
    chunk_tokens: int = Field(
        4096,
        ge=1,
        description="Most tokens per chunk sent to a worker: a few "
        "times the worker's saturation point, so big requests spread over replicas.",
    )
    max_chunk_sequences: int = Field(64, ge=1, le=4096, description="Most sequences per chunk.")
    max_request_bytes: int = Field(
        8 << 20, ge=1024, description="Largest HTTP body, in bytes (413 above; default 8 MiB)."
    )
    max_client_batch_size: int = Field(
        2048, ge=1, description="Most inputs per request (413 above; OpenAI's own limit)."
    )
    max_concurrent_requests: int = Field(
        512, ge=1, description="Requests handled at once; one more gets 429 at once (TEI's default)."
    )
    request_timeout_seconds: float = Field(
        60.0, ge=0.1, le=3600, description="Deadline of one request, in seconds (504 after)."
    )
    auto_truncate: bool = Field(True, description="Truncate over-long inputs (true) or refuse them with 413.")
    api_key_secret_ref: SecretKeyRef | None = Field(
        None,
        description="Secret key holding the API key clients must send as `Authorization: Bearer <key>` "
        "(every route but /health, /ready and /metrics); passed to the gateway as KEMBED_GATEWAY_API_KEY.",
    )
    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="Gateway processes per pod, on one port (KEMBED_GATEWAY_PROCESSES): each does its HTTP, "
        "JSON, tokenization and gRPC work on one core, so more processes serve more requests per second "
        "per pod. The pod's CPU request is at least this many cores (a lower resources.requests.cpu is "
        "raised to it); each process holds its own tokenizers and connections, so give memory to match. "
        "1 by default, the gateway's own: scale with replicas first, processes where pods are few.",
    )
    priority_class_name: str = Field(
        "",
        max_length=253,
        pattern=PRIORITY_CLASS_PATTERN,
        description="PriorityClass of the gateway pods; empty (the default) leaves the cluster's default.",
    )
    topology_spread: TopologySpreadSpec = Field(
        default_factory=TopologySpreadSpec,
        description="How the gateway pods spread over nodes and zones (soft by default); during a rolling "
        "update only pods of the same template are counted.",
    )
    disruption_budget: DisruptionBudgetSpec = Field(
        default_factory=DisruptionBudgetSpec,
        description="The gateway's PodDisruptionBudget (default maxUnavailable: 1: with the default 2 "
        "replicas one keeps serving through a drain).",
    )
    autoscaling: GatewayAutoscalingSpec = Field(
        default_factory=GatewayAutoscalingSpec,
        description="Gateway pods scaled on CPU by a HorizontalPodAutoscaler (off by default).",
    )
    connections: ConnectionLimitsSpec = Field(
        default_factory=ConnectionLimitsSpec,
        description="Client connection bounds per gateway process; each unset field keeps the gateway's "
        "default and is not rendered. Rolls the gateway only.",
    )

    @model_validator(mode="after")
    def _cpu_request_when_autoscaled(self) -> GatewaySpec:
        if self.autoscaling.enabled and "cpu" not in self.resources.requests:
            raise ValueError("autoscaling on CPU needs a cpu request in resources.requests")
        return self


# --- rollout ------------------------------------------------------------------------------------


class GraphsSpec(SpecModel):
    """Which CUDA-graph buckets worker pods capture before they take traffic. Not part of the
    revision: a change reaches worker pods started after it and never restarts running ones."""

    prewarm_buckets: list[Bucket] = Field(
        default_factory=list,
        max_length=256,
        description="Buckets SEQUENCESxTOKENS (e.g. 8x512) always captured: first when a worker pod "
        "starts, and again by the prewarm Job on every candidate pod.",
    )
    hot_buckets: int = Field(
        8,
        ge=0,
        le=256,
        description="How many of the serving revision's most-hit "
        "buckets the prewarm Job captures too, read from its workers' stats.",
    )
    startup_prewarm: Literal["all", "listed", "none"] = Field(
        "all",
        description="What a worker pod captures when it starts, before it accepts traffic: all (every "
        "bucket a batch can land in, prewarmBuckets first, then a cover that holds any batch within "
        "2x its tokens, then the rest), listed (prewarmBuckets only) or none (a bucket runs eagerly on "
        "its first hit and is captured on its second, while the batches behind it wait). After a "
        "start-up prewarm a worker never captures while serving: a batch pads up to a captured bucket, "
        "or runs eagerly and is captured when the worker is idle.",
    )
    prewarm_seconds: int = Field(
        120,
        ge=0,
        le=1200,
        description="Start-up capture budget of a worker pod, in seconds; what is left is captured when "
        "the worker is idle. A capture takes ~20 ms (a BGE-M3-class model has 200-400 buckets), a "
        "FlashAttention 4 kernel configuration compiles on first use in 1.5-3 s; the pod's start-up "
        "probe allows 30 minutes for weight load and prewarm together.",
    )


class RolloutSpec(SpecModel):
    """The gate a new revision passes before the gateway switches to it."""

    smoke_buckets: list[Bucket] = Field(
        default_factory=list,
        max_length=256,
        description="Buckets the smoke test replays against eager runs; empty means every captured one.",
    )
    min_cosine: float = Field(
        MIN_COSINE,
        ge=0.0,
        le=1.0,
        description="Lowest cosine similarity per row between "
        "graph replay and eager output that passes (bf16 replay vs eager is ~0.9999).",
    )
    golden_config_map: str | None = Field(
        None,
        description="ConfigMap of golden embeddings: each *.json key holds {token_ids: [[...]], "
        "embeddings: [[...]]}. The smoke Job embeds those token ids on every candidate pod and requires "
        "cosine >= minCosine per row against the stored embeddings.",
    )
    golden: Literal["Check", "Record", "Off"] = Field(
        "Check",
        description="Golden embeddings kept by the operator: beside the smoke test, a Job from the gateway "
        "image tokenizes fixed texts with the gateway's tokenizer and embeds (or, for a cross-encoder, "
        "scores) them on every candidate pod. Check: the first revision of given weights (the weight "
        "files' SHA-256, not the tokenizer, config or pooling) that passes the whole gate keeps its "
        "answer in a ConfigMap <name>-golden-<digest>; every later revision of the same weights must "
        "answer the same (cosine >= minCosine per text), else it blocks with GoldenMismatch, so a "
        "wrong tokenizer, pooling, prompt or engine is not promoted. Record: this revision's answer "
        "replaces the record of its weights (an intended change of the output). Off: no golden Job. "
        "Needs the operator's pods/log read (the chart grants it).",
    )
    max_surge_replicas: int | None = Field(
        None,
        ge=1,
        description="Roll out in steps, for clusters without a second set of GPUs: the new revision starts "
        "on this many pods beside the serving ones and passes the whole gate there; if it answers the "
        "golden texts as the serving weights do (the same weights, rollout.golden Check), the gateway "
        "serves from both revisions' pods while each step scales the serving revision down and the new "
        "one up by this many, each step's new pods gated by their own prewarm, smoke and golden Jobs "
        "(the golden Job compares them with a pod gated before). At most worker.replicas + this many "
        "GPUs' worth of pods run. A revision that answers otherwise (new weights) is never mixed: it "
        "grows to full size beside the serving one, as without this field. Unset: the new revision "
        "runs at full size beside the serving one (twice the GPUs) and the gateway switches at once. "
        "Ignored under spec.autoscaling, which owns the replicas.",
    )
    require_digests: bool = Field(
        False,
        description="Refuse image references without a digest (image@sha256:...): the worker and gateway "
        "images (the spec's or the operator's defaults) and an image-volume model source. Without it a "
        "tag is allowed, and the operator keeps the digest the gated pods ran: a serving pod that runs "
        "another (the tag moved, and a new node pulled it) pins the revision's Deployment to the gated "
        "digest, with a Warning event ImageDrift, so that every pod runs what passed the gate.",
    )
    ready_timeout_seconds: int = Field(
        1800,
        ge=10,
        description="Seconds the candidate workers may take to "
        "become ready (image pull, weight load) before the rollout blocks.",
    )
    prewarm_timeout_seconds: int = Field(900, ge=10, description="Deadline of the prewarm Job, in seconds.")
    smoke_timeout_seconds: int = Field(600, ge=10, description="Deadline of the smoke-test Job, in seconds.")
    promote_timeout_seconds: int = Field(
        600,
        ge=10,
        description="Seconds the gateway may take to become available on a revision that passed its gates "
        "(its pods rolled to it) before the rollout blocks with PromoteTimedOut; the gateway's pods still "
        "on the serving revision keep serving meanwhile, and no revision a gateway pod points at is "
        "deleted.",
    )


class MetricsSpec(SpecModel):
    """Prometheus scraping."""

    service_monitor: bool = Field(
        False,
        description="Create a ServiceMonitor for the gateway and a PodMonitor for the workers (Prometheus "
        "Operator; workers expose metrics on port 9091); off by default as their CRDs may not be installed. "
        "Turned off, the operator deletes those it made.",
    )
    interval: str = Field("30s", pattern=r"^[0-9]+(ms|s|m)$", description="Scrape interval.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels on the ServiceMonitor and PodMonitor, for a Prometheus that selects "
        "monitors by label (kube-prometheus-stack: release: <its release name>).",
    )


class EmbeddingModelSpec(SpecModel):
    """An embedding model served from GPU workers behind an HTTP gateway, rolled out gated."""

    model: ModelSpec = Field(description="The weights and how their output is presented.")
    worker: WorkerSpec = Field(default_factory=WorkerSpec, description="The GPU workers.")
    gateway: GatewaySpec = Field(default_factory=GatewaySpec, description="The HTTP gateway.")
    traffic_classes: TrafficClassesSpec = Field(
        default_factory=TrafficClassesSpec,
        description="Two classes of traffic: interactive (search-time queries, whose every millisecond "
        "shows) and bulk (indexing, where only throughput counts). The gateway classes each request by "
        "its X-Kembed-Priority header (interactive or bulk), else by its size; the workers run "
        "interactive sequences first and fill the room left with bulk. The workers' fields (enabled, "
        "bulkQueueShare, bulkStepTokens, interactiveHoldSeconds, bulkMaxWaitSeconds, interactiveLane) "
        "are part of the "
        "revision: a change rolls out through the prewarm and smoke gates, and the gateway takes the new "
        "values when it switches to that revision. interactiveMaxInputs, interactiveMaxTokens and "
        "bulkTokenizationProcesses roll the gateway only; bulkGateway adds or removes the bulk gateway "
        "only.",
    )
    graphs: GraphsSpec = Field(
        default_factory=GraphsSpec,
        description="CUDA-graph prewarming: at worker start and of a new revision.",
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="The rollout gate.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Prometheus scraping.")
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec,
        description="NetworkPolicies for the workers and the gateway (on by default): the workers' gRPC "
        "and data ports only from this model's gateway and rollout Jobs.",
    )
    endpoint: str = Field(
        "",
        max_length=40,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
        description="Serve this model behind a shared endpoint of that name: every EmbeddingModel of the "
        "namespace naming the same endpoint is served by one gateway Deployment and one Service, "
        "`<endpoint>-endpoint`, which routes each request by the model it names (its `model` field; "
        "for TEI's routes the X-Kembed-Model header or a /models/<name>/ path prefix; else the first "
        "model by name) to that model's own workers. A model is named by model.servedName, else its "
        "EmbeddingModel's name. Each model keeps its workers, revisions, rollout gate and autoscaling; "
        "the endpoint's pods, Service and HTTP edge settings (image, replicas, resources, service, "
        "apiKeySecretRef, maxRequestBytes, connections) are those of its first model by name. A "
        "model's rollout rolls the endpoint's gateway pods one at a time, each new pod ready before an "
        "old one drains: the other models' requests are never refused. Empty (the default): the "
        "model has a gateway of its own. Not with trafficClasses.bulkGateway, gateway.autoscaling or a "
        "huggingFace/s3 source (yet).",
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec,
        description="Worker pods of the serving revision scaled by KEDA on the workers' queued tokens "
        "(off by default). Not part of the revision: turning it on or changing it never rolls the "
        "workers out.",
    )

    @model_validator(mode="after")
    def _fp8_linears_on_a_gpu(self) -> EmbeddingModelSpec:
        if self.model.linear_dtype == "fp8" and self.worker.device == "cpu":
            raise ValueError("model.linearDtype fp8 needs fp8 tensor cores: worker.device must not be cpu")
        return self

    @model_validator(mode="after")
    def _endpoint_member(self) -> EmbeddingModelSpec:
        if not self.endpoint:
            return self
        if self.traffic_classes.bulk_gateway is not None:
            raise ValueError("endpoint: a model behind a shared endpoint has no bulk gateway of its own")
        if self.gateway.autoscaling.enabled:
            raise ValueError("endpoint: the shared endpoint's gateway is not autoscaled (gateway.replicas)")
        if self.model.source.fetched is not None:
            raise ValueError("endpoint: a huggingFace or s3 source cannot join a shared endpoint yet")
        return self

    @model_validator(mode="after")
    def _sizes_agree(self) -> EmbeddingModelSpec:
        if self.gateway.chunk_tokens > self.worker.max_queued_tokens:
            raise ValueError(
                "gateway.chunkTokens must not exceed worker.maxQueuedTokens: a larger chunk is always refused"
            )
        if self.traffic_classes.bulk_step_tokens > self.worker.max_batch_tokens:
            raise ValueError(
                "trafficClasses.bulkStepTokens must not exceed worker.maxBatchTokens: bulk steps are part "
                "of a batch"
            )
        if self.graphs.prewarm_buckets and not self.worker.cuda_graphs:
            raise ValueError("graphs.prewarmBuckets needs worker.cudaGraphs")
        return self

    @model_validator(mode="after")
    def _autoscaling_target_below_the_queue_cap(self) -> EmbeddingModelSpec:
        autoscaling = self.autoscaling
        if (
            autoscaling.enabled
            and autoscaling.target_queued_tokens_per_replica >= self.worker.max_queued_tokens
        ):
            raise ValueError(
                "autoscaling.targetQueuedTokensPerReplica must be below worker.maxQueuedTokens: a worker "
                "never queues more"
            )
        return self


def parse_spec(raw: dict[str, Any]) -> EmbeddingModelSpec:
    """A body's spec as the typed model; pydantic.ValidationError on a bad one."""
    return EmbeddingModelSpec.model_validate(raw)
