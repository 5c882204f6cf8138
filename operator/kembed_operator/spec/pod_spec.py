"""The pod settings a platform team gives the gateway's and the workers' pods: image pull secrets, a
service account, a runtime class, extra environment, pod labels and annotations, placement (node
selector, tolerations, affinity) and the user and groups the containers run as (`securityContext`).

`PodSettings` holds them for both components: `WorkerSpec` and `GatewaySpec` (spec.py) build on it. Each
is rendered only when set (pod_fields.py), so a model that sets none renders the pods it rendered before
these fields existed. Which of them are part of a worker revision is revision.py's rule. The validators
here twin the CRD's CEL rules (crd.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, model_validator

from kembed.operator.spec.spec_base import SpecModel

RUN_AS = 10001  # the uid/gid the kembed images create; any non-root uid works with a readable model
MAX_ID = 2147483647  # the largest uid/gid a pod's securityContext takes
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # a DNS subdomain: Secret, ServiceAccount, ...
OPTIONAL_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$"  # empty, or a DNS subdomain
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"  # what every Kubernetes version takes
KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"  # a ConfigMap or Secret key
# A label or annotation key: an optional DNS-subdomain prefix and '/', then a name of at most 63.
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Pod label keys the operator sets itself (naming.labels, the Jobs' attempt): its selectors, network
# policies and dashboards rely on them, so a pod label may not name one. kembed.dev/ is refused whole.
OPERATOR_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
)
OPERATOR_PREFIX = "kembed.dev/"
# Variables the operator sets on the worker or gateway container (its engine ConfigMap included): an
# `env` entry may not name one, since it would silently win over the spec field that sets it (a
# container's env beats its envFrom) or break what the operator relies on (ports, the model's path).
# Other KEMBED_WORKER_* / KEMBED_GATEWAY_* variables pass: a flag the CRD does not carry (the log
# level, say). A test checks this list against what the operator renders with every option on; a
# name added later refuses models that already set it, so add one only with the field that sets it.
OPERATOR_ENV = (
    "HOME",
    "TMPDIR",
    "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED",
    "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "KEMBED_REVISION",
    "KEMBED_WORKER_MODEL",
    "KEMBED_WORKER_HOST",
    "KEMBED_WORKER_PORT",
    "KEMBED_WORKER_DATA_PORT",
    "KEMBED_WORKER_DEVICE",
    "KEMBED_WORKER_DTYPE",
    "KEMBED_WORKER_LINEAR_DTYPE",
    "KEMBED_WORKER_ATTENTION_BACKEND",
    "KEMBED_WORKER_MAX_BATCH_TOKENS",
    "KEMBED_WORKER_MAX_QUEUED_TOKENS",
    "KEMBED_WORKER_MAX_BATCH_SEQUENCES",
    "KEMBED_WORKER_MAX_INFLIGHT_BATCHES",
    "KEMBED_WORKER_CUDA_GRAPHS",
    "KEMBED_WORKER_MAX_GRAPHS",
    "KEMBED_WORKER_MAX_PINNED_BYTES",
    "KEMBED_WORKER_NUM_THREADS",
    "KEMBED_WORKER_PRIORITY_CLASSES",
    "KEMBED_WORKER_BULK_QUEUE_SHARE",
    "KEMBED_WORKER_BULK_STEP_TOKENS",
    "KEMBED_WORKER_INTERACTIVE_HOLD_S",
    "KEMBED_WORKER_BULK_MAX_WAIT_S",
    "KEMBED_WORKER_INTERACTIVE_LANE",
    "KEMBED_WORKER_LANE_INFLIGHT_BATCHES",
    "KEMBED_WORKER_METRICS_PORT",
    "KEMBED_WORKER_PREWARM",
    "KEMBED_WORKER_PREWARM_HOT",
    "KEMBED_WORKER_PREWARM_SECONDS",
    "KEMBED_WORKER_PREWARM_OBSERVED",
    "KEMBED_WORKER_SERVED_MODEL_NAME",
    "KEMBED_WORKER_POOLING",
    "KEMBED_WORKER_NORMALIZE",
    "KEMBED_WORKER_AUTH_TOKEN",
    "KEMBED_GATEWAY_MODEL_DIR",
    "KEMBED_GATEWAY_HOST",
    "KEMBED_GATEWAY_PORT",
    "KEMBED_GATEWAY_WORKER_SERVICE",
    "KEMBED_GATEWAY_CHUNK_TOKENS",
    "KEMBED_GATEWAY_MAX_CHUNK_SEQUENCES",
    "KEMBED_GATEWAY_MAX_REQUEST_BYTES",
    "KEMBED_GATEWAY_MAX_CLIENT_BATCH_SIZE",
    "KEMBED_GATEWAY_MAX_CONCURRENT_REQUESTS",
    "KEMBED_GATEWAY_REQUEST_TIMEOUT_S",
    "KEMBED_GATEWAY_AUTO_TRUNCATE",
    "KEMBED_GATEWAY_INTERACTIVE_MAX_INPUTS",
    "KEMBED_GATEWAY_INTERACTIVE_MAX_TOKENS",
    "KEMBED_GATEWAY_PRIORITY_CLASSES",
    "KEMBED_GATEWAY_BULK_QUEUE_SHARE",
    "KEMBED_GATEWAY_PROCESSES",
    "KEMBED_GATEWAY_BULK_TOKENIZATION_PROCESSES",
    "KEMBED_GATEWAY_MAX_CONNECTIONS",
    "KEMBED_GATEWAY_HEADER_TIMEOUT_S",
    "KEMBED_GATEWAY_BODY_TIMEOUT_S",
    "KEMBED_GATEWAY_KEEP_ALIVE_TIMEOUT_S",
    "KEMBED_GATEWAY_SERVED_MODEL_NAMES",
    "KEMBED_GATEWAY_MAX_SEQ_LENGTH",
    "KEMBED_GATEWAY_PROMPTS",
    "KEMBED_GATEWAY_API_KEY",
    "KEMBED_GATEWAY_WORKER_AUTH_TOKEN",
)

LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]


class LocalObjectReference(SpecModel):
    """An object in the model's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN, description="Its name.")


class KeySelector(SpecModel):
    """A key of a Secret or ConfigMap in the model's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN, description="Its name.")
    key: str = Field(min_length=1, max_length=253, pattern=KEY_PATTERN, description="The key.")
    optional: bool = Field(False, description="Start the pod even when the object or key is missing.")


class FieldSelector(SpecModel):
    """A field of the pod (downward API)."""

    field_path: str = Field(
        min_length=1, max_length=256, description="e.g. metadata.name, status.podIP, spec.nodeName."
    )


class ResourceFieldSelector(SpecModel):
    """A resource request or limit of the container (downward API)."""

    resource: str = Field(min_length=1, max_length=64, description="e.g. limits.memory, requests.cpu.")
    divisor: int | str = Field(1, description="Unit of the value, a quantity (1, 1Mi, 1m); default 1.")


class EnvVarSource(SpecModel):
    """Where a variable's value comes from: exactly one of these."""

    secret_key_ref: KeySelector | None = Field(None, description="A Secret's key.")
    config_map_key_ref: KeySelector | None = Field(None, description="A ConfigMap's key.")
    field_ref: FieldSelector | None = Field(None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(None, description="A resource of the container.")

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        sources = (self.secret_key_ref, self.config_map_key_ref, self.field_ref, self.resource_field_ref)
        if sum(source is not None for source in sources) != 1:
            raise ValueError(
                "valueFrom takes exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef"
            )
        return self


class EnvVar(SpecModel):
    """An environment variable of the container, as in a Pod."""

    name: str = Field(min_length=1, max_length=128, pattern=ENV_NAME_PATTERN, description="Its name.")
    value: str | None = Field(None, max_length=32768, description="Its value ($(NAME) expands another).")
    value_from: EnvVarSource | None = Field(
        None, description="Its value from a Secret, ConfigMap or the pod."
    )

    @model_validator(mode="after")
    def _one_value(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: value or valueFrom, not both")
        return self


class EnvFromSecretOrConfigMap(SpecModel):
    """A Secret or ConfigMap in the model's namespace whose every key becomes a variable."""

    name: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN, description="Its name.")
    optional: bool = Field(False, description="Start the pod even when it is missing.")


class EnvFromSource(SpecModel):
    """Every key of a ConfigMap or a Secret as a variable (exactly one of the two)."""

    prefix: str = Field(
        "", max_length=128, pattern=r"^([-._a-zA-Z][-._a-zA-Z0-9]*)?$", description="Put before each key."
    )
    config_map_ref: EnvFromSecretOrConfigMap | None = Field(None, description="A ConfigMap.")
    secret_ref: EnvFromSecretOrConfigMap | None = Field(None, description="A Secret.")

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvFromSource:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError("an envFrom entry names a configMapRef or a secretRef: exactly one")
        return self


class PodSecuritySpec(SpecModel):
    """The user and groups the pod's containers run as. Whatever is set here, they run non-root, with
    seccomp RuntimeDefault, no privilege escalation, no capabilities and a read-only root filesystem
    (the restricted Pod Security Standard, and what OpenShift's restricted-v2 SCC requires)."""

    fixed_ids: bool = Field(
        True,
        description="true (the default): run as runAsUser and runAsGroup, with fsGroup on the volumes. "
        "false: set no UID, GID or fsGroup and let the cluster choose: OpenShift's restricted-v2 SCC "
        "refuses a UID outside the namespace's range and assigns one from it (runAsNonRoot stays). The "
        "kembed images run as any UID: they write only to /tmp (an emptyDir) and the kernel cache claim.",
    )
    run_as_user: int = Field(
        RUN_AS,
        ge=1,
        le=MAX_ID,
        description="UID of the containers (default 10001, the UID the kembed images create). Only with "
        "fixedIds.",
    )
    run_as_group: int = Field(
        RUN_AS, ge=0, le=MAX_ID, description="GID of the containers (default 10001). Only with fixedIds."
    )
    fs_group: int = Field(
        RUN_AS,
        ge=0,
        le=MAX_ID,
        description="Group that owns the pod's volumes (the kernel cache claim, a model claim) and may "
        "write them (default 10001). Only with fixedIds.",
    )

    @model_validator(mode="after")
    def _ids_only_when_fixed(self) -> PodSecuritySpec:
        if not self.fixed_ids and (self.run_as_user, self.run_as_group, self.fs_group) != (RUN_AS,) * 3:
            raise ValueError("runAsUser, runAsGroup and fsGroup are set only with fixedIds: true")
        return self


class PodSettings(SpecModel):
    """The pod settings the gateway and the workers share (pod_spec.py); each is rendered only when set."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods require (e.g. a GPU model)."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Pod tolerations, as in a Pod spec (e.g. for tainted GPU nodes)."
    )
    affinity: dict[str, Any] = Field(default_factory=dict, description="Pod affinity, as in a Pod spec.")
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets (kubernetes.io/dockerconfigjson) the kubelet pulls the image with, for a "
        "private registry; the workers' also go to the prewarm and smoke-test Jobs, which run the worker "
        "image. Not part of a worker revision: a change rolls the serving workers' pods in place.",
    )
    service_account_name: str = Field(
        "",
        max_length=253,
        pattern=OPTIONAL_NAME_PATTERN,
        description="ServiceAccount the pods run as; empty: the namespace's default. Its imagePullSecrets "
        "and what it is granted (an OpenShift SCC, say) apply; its API token is not mounted (the pods "
        "never call the API server). The workers' also runs the rollout Jobs. Part of a worker revision "
        "when set.",
    )
    runtime_class_name: str = Field(
        "",
        max_length=253,
        pattern=OPTIONAL_NAME_PATTERN,
        description="RuntimeClass of the pods, e.g. nvidia where the NVIDIA container runtime is not the "
        "node's default (k3s, some GPU Operator installs); empty: the node's default runtime. Part of a "
        "worker revision when set.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment variables of the container (value or valueFrom, as in a Pod), "
        "after the operator's own. A variable the operator sets itself (HOME, TMPDIR, KEMBED_REVISION, "
        "the kembed settings it renders from the spec) is refused: set its field instead; other "
        "KEMBED_WORKER_* / KEMBED_GATEWAY_* flags pass (e.g. KEMBED_WORKER_LOG_LEVEL). On the workers, "
        "part of the revision when set (a change goes through the gates); a referenced Secret's or "
        "ConfigMap's value is read when a pod starts.",
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=16,
        description="ConfigMaps and Secrets whose every key becomes a variable, as in a Pod. The operator's "
        "own variables win over theirs. On the workers, part of the revision when set (the names, not "
        "the values: those are read when a pod starts).",
    )
    pod_labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Labels added to the pods (cost allocation, a queue, a mesh). The operator's own keys "
        "(app.kubernetes.io/name, instance, part-of, managed-by, component, and kembed.dev/*) are refused. "
        "Not part of a worker revision: a change rolls the serving workers' pods in place.",
    )
    pod_annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=32,
        description="Annotations added to the pods (kembed.dev/* is refused). Not part of a worker "
        "revision: a change rolls the serving workers' pods in place.",
    )
    security_context: PodSecuritySpec = Field(
        default_factory=PodSecuritySpec,
        description="The user and groups the containers run as: UID/GID 10001 by default, or "
        "fixedIds: false to let the cluster assign them (OpenShift). On the workers, part of the "
        "revision when not at its defaults; the rollout Jobs follow the workers'.",
    )

    @model_validator(mode="after")
    def _operator_names_kept(self) -> PodSettings:
        if clash := sorted({e.name for e in self.env} & set(OPERATOR_ENV)):
            raise ValueError(f"env: the operator sets {', '.join(clash)} itself: use the spec's fields")
        for key in self.pod_labels:
            if not re.fullmatch(QUALIFIED_NAME, key):
                raise ValueError(f"podLabels: {key!r} is not a label key")
            if key in OPERATOR_LABELS or key.startswith(OPERATOR_PREFIX):
                raise ValueError(f"podLabels: {key} is the operator's own label")
        for key in self.pod_annotations:
            if not re.fullmatch(QUALIFIED_NAME, key):
                raise ValueError(f"podAnnotations: {key!r} is not an annotation key")
            if key.startswith(OPERATOR_PREFIX):
                raise ValueError(f"podAnnotations: {key} is the operator's own")
        return self
