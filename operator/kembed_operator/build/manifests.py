"""Pure manifest builders: spec in, Kubernetes objects (dicts) out. No I/O, no clock, no randomness.

Per revision: an immutable ConfigMap of engine settings (`KEMBED_WORKER_*`), a worker Deployment and
a headless Service. Per model: the gateway Deployment and Service (and a ServiceMonitor when asked),
and the same again for the bulk gateway when trafficClasses.bulkGateway is set;
every worker pod also reads the model's hot list, a ConfigMap the operator's timer writes
(hot_buckets.py).
The Jobs are in `jobs.py`, the PodDisruptionBudgets and NetworkPolicies in `policies.py`, the pods'
spread, priority and grace periods in `placement.py`, the pod settings a spec adds (pull secrets,
service account, runtime class, env, pod labels and annotations, node selector, tolerations,
affinity, the UID) in `pod_fields.py`. Every object carries an owner reference to its
EmbeddingModel (so the garbage collector removes it with the model) and the `app.kubernetes.io/*`
labels. Pods run non-root (UID 10001 unless securityContext says otherwise) on a read-only root
filesystem with every capability dropped; /tmp is an emptyDir.
"""

from __future__ import annotations

import json
from typing import Any

from kembed.operator.build import naming as n
from kembed.operator.build import placement
from kembed.operator.build import pod_fields as pf
from kembed.operator.build.naming import Owner
from kembed.operator.spec.edge_spec import CONNECTION_VARIABLES
from kembed.operator.spec.model_spec import ModelSource
from kembed.operator.spec.pod_spec import PodSecuritySpec
from kembed.operator.spec.spec import EmbeddingModelSpec, Resources, is_gpu_resource

MODEL_MOUNT = "/models/model"
GATEWAY_PORT = 8080
WORKER_METRICS_PORT = 9091  # the worker's default metrics port (kembed.worker --metrics-port)
# The worker's data port (kembed.worker --data-port): the gateway's requests as frames; fixed in a pod
# (a free one by default) so that Services and network policies can name it.
WORKER_DATA_PORT = 50052
PRESTOP_SLEEP_S = placement.GATEWAY_PRESTOP_S  # endpoints drop a terminating gateway pod before it stops


def metadata(owner: Owner, name: str, component: str, revision: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": n.labels(owner, component, revision),
        "ownerReferences": [owner.reference()],
    }


def resources(res: Resources) -> dict[str, Any]:
    out = {}
    if res.requests:
        out["requests"] = {k: str(v) for k, v in res.requests.items()}
    if res.limits:
        out["limits"] = {k: str(v) for k, v in res.limits.items()}
    return out


def model_volume(source: ModelSource) -> dict[str, Any]:
    if source.pvc is not None:
        return {
            "name": "model",
            "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True},
        }
    if source.host_path is not None:
        return {"name": "model", "hostPath": {"path": source.host_path.path, "type": "Directory"}}
    if source.fetched is not None:  # made the fetched model by model_fetch.with_fetch
        return {"name": "model", "emptyDir": {}}
    assert source.image is not None, "the CRD admits exactly one source"
    return {
        "name": "model",
        "image": {"reference": source.image.reference, "pullPolicy": source.image.pull_policy},
    }


def model_mount(source: ModelSource) -> dict[str, Any]:
    mount = {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
    sub_path = (source.pvc and source.pvc.path) or (source.image and source.image.path) or ""
    if sub_path:
        mount["subPath"] = sub_path.strip("/")
    return mount


def scratch() -> tuple[dict[str, Any], dict[str, Any]]:
    """/tmp as an emptyDir: the root filesystem is read-only, and torch/triton write caches."""
    return {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}, {"name": "tmp", "mountPath": "/tmp"}


def base_env() -> list[dict[str, str]]:
    return [{"name": "HOME", "value": "/tmp"}, {"name": "TMPDIR", "value": "/tmp"}]


KERNEL_CACHE_MOUNT = "/var/cache/kembed"


def kernel_cache(
    spec: EmbeddingModelSpec,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, str]]]:
    """(volumes, mounts, env) that keep the kernels a worker compiles: FlashAttention 4's disk cache
    (off unless asked for) and Triton's, on the claim `worker.kernelCacheClaim` names, else in /tmp."""
    claim = spec.worker.kernel_cache_claim
    root = KERNEL_CACHE_MOUNT if claim else "/tmp/kernels"
    env = [
        {"name": "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "value": "1"},
        {"name": "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "value": f"{root}/flash-attn4"},
        {"name": "TRITON_CACHE_DIR", "value": f"{root}/triton"},
    ]
    if not claim:
        return [], [], env
    volume = {"name": "kernel-cache", "persistentVolumeClaim": {"claimName": claim}}
    return [volume], [{"name": "kernel-cache", "mountPath": KERNEL_CACHE_MOUNT}], env


def worker_token_env(spec: EmbeddingModelSpec, name: str) -> list[dict[str, Any]]:
    """The workers' shared token from its Secret as variable `name` (none when the spec sets none)."""
    ref = spec.worker.auth_token_secret_ref
    if ref is None:
        return []
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def pod_spec(
    containers: list[dict[str, Any]], volumes: list[dict[str, Any]], security: PodSecuritySpec, **extra: Any
) -> dict[str, Any]:
    return {
        # No service links: a Service named e.g. `kembed-gateway` would inject KEMBED_GATEWAY_PORT=tcp://…
        # into every pod of the namespace, and that is the gateway's own port setting.
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pf.pod_security(security),
        "containers": containers,
        "volumes": volumes,
        **extra,
    }


# --- per revision -------------------------------------------------------------------------------


def worker_device(spec: EmbeddingModelSpec) -> str:
    """The worker's --device: `cuda` where the pod is given a GPU (nvidia.com/gpu or a MIG slice),
    also for `auto`, so that a pod whose torch sees no CUDA device (a driver mismatch) fails to start
    instead of serving on its CPU while it holds a GPU; else the spec's."""
    r = spec.worker.resources
    has_gpu = any(is_gpu_resource(name) for name in (*r.limits, *r.requests))
    return "cuda" if spec.worker.device == "auto" and has_gpu else spec.worker.device


def engine_settings(spec: EmbeddingModelSpec, revision: str) -> dict[str, str]:
    """The worker's `KEMBED_WORKER_*` environment (see `python -m kembed.worker --help`)."""
    w, m, t = spec.worker, spec.model, spec.traffic_classes
    env = {
        "KEMBED_WORKER_MODEL": MODEL_MOUNT,
        "KEMBED_WORKER_HOST": "0.0.0.0",
        "KEMBED_WORKER_PORT": str(w.port),
        "KEMBED_WORKER_DATA_PORT": str(WORKER_DATA_PORT),
        "KEMBED_WORKER_DEVICE": worker_device(spec),
        "KEMBED_WORKER_DTYPE": m.dtype,
        "KEMBED_WORKER_ATTENTION_BACKEND": w.attention_backend,
        "KEMBED_WORKER_MAX_BATCH_TOKENS": str(w.max_batch_tokens),
        "KEMBED_WORKER_MAX_QUEUED_TOKENS": str(w.max_queued_tokens),
        "KEMBED_WORKER_MAX_BATCH_SEQUENCES": str(w.max_batch_sequences),
        "KEMBED_WORKER_MAX_INFLIGHT_BATCHES": str(w.max_inflight_batches),
        "KEMBED_WORKER_CUDA_GRAPHS": "true" if w.cuda_graphs else "false",
        "KEMBED_WORKER_MAX_GRAPHS": str(w.max_graphs),
        "KEMBED_WORKER_MAX_PINNED_BYTES": str(w.max_pinned_bytes),
        "KEMBED_WORKER_NUM_THREADS": str(w.num_threads),
        # The class rule (worker/scheduling/queues.py), part of the revision: a pod keeps the rule it
        # started with.
        "KEMBED_WORKER_PRIORITY_CLASSES": "true" if t.enabled else "false",
        "KEMBED_WORKER_BULK_QUEUE_SHARE": str(t.bulk_queue_share),
        "KEMBED_WORKER_BULK_STEP_TOKENS": str(t.bulk_step_tokens),  # 0: the worker takes half its budget
        "KEMBED_WORKER_INTERACTIVE_HOLD_S": str(t.interactive_hold_seconds),
        "KEMBED_WORKER_BULK_MAX_WAIT_S": str(t.bulk_max_wait_seconds),
        "KEMBED_WORKER_METRICS_PORT": str(WORKER_METRICS_PORT),
        "KEMBED_REVISION": revision,
    }
    if m.linear_dtype != "auto":  # set only away from the default, as the lane below
        env["KEMBED_WORKER_LINEAR_DTYPE"] = m.linear_dtype
    if not t.interactive_lane:  # the worker's default is on; set only when off, so templates of
        env["KEMBED_WORKER_INTERACTIVE_LANE"] = "false"  # revisions from before it stay unchanged
    if t.lane_inflight_batches != 2:  # likewise, away from the worker's default only
        env["KEMBED_WORKER_LANE_INFLIGHT_BATCHES"] = str(t.lane_inflight_batches)
    # What a pod captures at start, before it binds its port (and so before it is ready). Not part
    # of the revision: a change replaces this ConfigMap and reaches pods started after it.
    g = spec.graphs
    env["KEMBED_WORKER_PREWARM"] = (
        g.startup_prewarm if g.startup_prewarm != "listed" else ",".join(g.prewarm_buckets) or "none"
    )
    if g.prewarm_buckets and g.startup_prewarm == "all":
        env["KEMBED_WORKER_PREWARM_HOT"] = ",".join(g.prewarm_buckets)
    env["KEMBED_WORKER_PREWARM_SECONDS"] = str(g.prewarm_seconds)
    if m.served_name:
        env["KEMBED_WORKER_SERVED_MODEL_NAME"] = m.served_name
    # Overrides of the model's own pipeline: only written when set, so a model served as shipped
    # carries none.
    if m.pooling is not None:
        env["KEMBED_WORKER_POOLING"] = m.pooling
    if m.normalize is not None:
        env["KEMBED_WORKER_NORMALIZE"] = "true" if m.normalize else "false"
    return env


def engine_config_map(owner: Owner, spec: EmbeddingModelSpec, revision: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, n.engine_config_name(owner, revision), "worker", revision),
        # one per revision, replaced (never edited) when its prewarm settings change: a running pod
        # keeps the settings it started with
        "immutable": True,
        "data": engine_settings(spec, revision),
    }


HOT_LIST_KEY = "buckets"  # the key of the model's hot-buckets ConfigMap that holds the list


def hot_list_env(owner: Owner) -> dict[str, Any]:
    """The model's hot list (hot_buckets.py), read when the container starts: the template only names
    the ConfigMap, so the operator rewriting the list never rolls the Deployment. Optional: a pod
    starts before the first list is written, and then prewarms without one."""
    ref = {"name": n.hot_buckets_name(owner), "key": HOT_LIST_KEY, "optional": True}
    return {"name": "KEMBED_WORKER_PREWARM_OBSERVED", "valueFrom": {"configMapKeyRef": ref}}


def worker_deployment(owner: Owner, spec: EmbeddingModelSpec, revision: str, image: str) -> dict[str, Any]:
    w = spec.worker
    name = n.workers_name(owner, revision)
    tmp_volume, tmp_mount = scratch()
    cache_volumes, cache_mounts, cache_env = kernel_cache(spec)
    # The worker binds its port only once the model is loaded and its start-up prewarm is done, then
    # answers the standard gRPC health check SERVING, and NOT_SERVING once it drains. A check is
    # answered by its event loop, so a wedged worker fails it (a TCP probe only sees the kernel accept).
    # Kubernetes' gRPC probe takes a port number, not a name; it sends no token (health stays open).
    probe = {"grpc": {"port": w.port}}
    container = {
        "name": "worker",
        "image": image,
        "imagePullPolicy": w.image_pull_policy,
        "command": ["kembed-worker"],
        # The spec's envFrom first: of two sources with a key, the later wins, so ours does.
        "envFrom": [*pf.env_from(w), {"configMapRef": {"name": n.engine_config_name(owner, revision)}}],
        "env": base_env()
        + cache_env
        + worker_token_env(spec, "KEMBED_WORKER_AUTH_TOKEN")
        + [hot_list_env(owner)]
        + pf.env(w),  # after ours, so a value can use $(HOME); the CRD refuses our names there
        "ports": [
            {"name": "grpc", "containerPort": w.port, "protocol": "TCP"},
            {"name": "data", "containerPort": WORKER_DATA_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": WORKER_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": resources(w.resources),
        "securityContext": pf.container_security(),
        "volumeMounts": [model_mount(spec.model.source), tmp_mount, *cache_mounts],
        # Weight load, allocation and the start-up prewarm (graphs.prewarmSeconds at most) can take
        # minutes on a large model: up to 30 min before liveness.
        "startupProbe": probe | {"periodSeconds": 5, "failureThreshold": 360},
        "readinessProbe": probe | {"periodSeconds": 5, "failureThreshold": 2},
        # A stalled worker (stalls.py) answers NOT_SERVING, a wedged one not at all: restarted once it
        # has been so for worker.stallRestartSeconds (consecutive failures, one per period).
        "livenessProbe": probe
        | {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": -(-w.stall_restart_seconds // 10)},
    }
    # Longer than the worker's drain (placement.py), so SIGKILL never cuts a request it is answering.
    extra: dict[str, Any] = {"terminationGracePeriodSeconds": placement.worker_grace_s()}
    extra |= placement.pod_placement(w, n.selector(owner, "worker", revision), is_rolling=False)
    extra |= pf.pod_fields(w)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, name, "worker", revision),
        "spec": {
            "replicas": w.replicas,
            # What a worker computes never changes in place (a new revision is a new Deployment); only
            # what the revision leaves out does (pod labels, annotations, pull secrets: revision.py).
            "revisionHistoryLimit": 1,
            # Such an in-place roll (or a restart) never takes a serving pod down before its
            # replacement is ready: one spare GPU at a time, not Kubernetes' default of a quarter of
            # the pods unavailable at once.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "selector": {"matchLabels": n.selector(owner, "worker", revision)},
            "template": {
                "metadata": pf.template_metadata(w, n.labels(owner, "worker", revision)),
                "spec": pod_spec(
                    [container],
                    [model_volume(spec.model.source), tmp_volume, *cache_volumes],
                    w.security_context,
                    **extra,
                ),
            },
        },
    }


def worker_service(owner: Owner, spec: EmbeddingModelSpec, revision: str) -> dict[str, Any]:
    """Headless: its DNS name resolves to the revision's ready pods, one gRPC channel each."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, n.workers_name(owner, revision), "worker", revision),
        "spec": {
            "clusterIP": "None",
            "selector": n.selector(owner, "worker", revision),
            "ports": [
                {"name": "grpc", "port": spec.worker.port, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "data", "port": WORKER_DATA_PORT, "targetPort": "data", "protocol": "TCP"},
            ],
        },
    }


def worker_service_address(owner: Owner, spec: EmbeddingModelSpec, revision: str) -> str:
    """What the gateway follows for a revision: its headless Service, `host:port`. The gateway
    resolves it every few seconds and keeps a channel per ready pod it lists (gateway/pool/workers.py), so
    work is balanced per pod, a pod added by scaling or rescheduling gets work within seconds, and
    a change of worker.replicas (or the autoscaler's) never touches the gateway's Deployment."""
    return f"{n.workers_name(owner, revision)}.{owner.namespace}.svc:{spec.worker.port}"


# --- gateway ------------------------------------------------------------------------------------


def gateway_env(owner: Owner, spec: EmbeddingModelSpec, revision: str) -> list[dict[str, Any]]:
    g, m, t = spec.gateway, spec.model, spec.traffic_classes
    values = {
        "KEMBED_GATEWAY_MODEL_DIR": MODEL_MOUNT,
        "KEMBED_GATEWAY_HOST": "0.0.0.0",
        "KEMBED_GATEWAY_PORT": str(GATEWAY_PORT),
        # "<a>+<b>": a stepwise rollout's two interchangeable revisions, one pool (rollout.py)
        "KEMBED_GATEWAY_WORKER_SERVICE": ",".join(
            worker_service_address(owner, spec, part) for part in revision.split("+")
        ),
        "KEMBED_GATEWAY_CHUNK_TOKENS": str(g.chunk_tokens),
        "KEMBED_GATEWAY_MAX_CHUNK_SEQUENCES": str(g.max_chunk_sequences),
        "KEMBED_GATEWAY_MAX_REQUEST_BYTES": str(g.max_request_bytes),
        "KEMBED_GATEWAY_MAX_CLIENT_BATCH_SIZE": str(g.max_client_batch_size),
        "KEMBED_GATEWAY_MAX_CONCURRENT_REQUESTS": str(g.max_concurrent_requests),
        "KEMBED_GATEWAY_REQUEST_TIMEOUT_S": str(g.request_timeout_seconds),
        "KEMBED_GATEWAY_AUTO_TRUNCATE": "true" if g.auto_truncate else "false",
        "KEMBED_GATEWAY_INTERACTIVE_MAX_INPUTS": str(t.interactive_max_inputs),
        "KEMBED_GATEWAY_INTERACTIVE_MAX_TOKENS": str(t.interactive_max_tokens),
        # Classes off, the workers queue bulk as they queue interactive requests: admit it alike.
        "KEMBED_GATEWAY_PRIORITY_CLASSES": "true" if t.enabled else "false",
        "KEMBED_GATEWAY_BULK_QUEUE_SHARE": str(t.bulk_queue_share),
        "KEMBED_GATEWAY_PROCESSES": str(g.processes),  # one core each: see placement.gateway_resources
    }
    # Off by default (the gateway's own default): written only when set, so that the gateway's
    # template of a model without it stays as it was and an operator upgrade does not roll it.
    if t.bulk_tokenization_processes:
        values["KEMBED_GATEWAY_BULK_TOKENIZATION_PROCESSES"] = str(t.bulk_tokenization_processes)
    for field, variable in CONNECTION_VARIABLES.items():  # each only when set, as above
        if (limit := getattr(g.connections, field)) is not None:
            values[variable] = str(limit)
    if spec.autoscaling.enabled and spec.autoscaling.scale_to_zero:  # at zero workers: held, woken
        values["KEMBED_GATEWAY_MAX_HELD_REQUESTS"] = str(spec.autoscaling.max_held_requests)
        values["KEMBED_GATEWAY_WAKE_TIMEOUT_S"] = str(spec.autoscaling.wake_timeout_seconds)
    if m.served_name:
        values["KEMBED_GATEWAY_SERVED_MODEL_NAMES"] = m.served_name
    # normalize is the worker's setting: the gateway normalises as the worker's Info says.
    if m.max_sequence_length is not None:
        values["KEMBED_GATEWAY_MAX_SEQ_LENGTH"] = str(m.max_sequence_length)
    if m.prompts:
        values["KEMBED_GATEWAY_PROMPTS"] = prompts_json(m.prompts)
    env: list[dict[str, Any]] = base_env() + [{"name": k, "value": v} for k, v in values.items()]
    if g.api_key_secret_ref is not None:
        ref = {"name": g.api_key_secret_ref.name, "key": g.api_key_secret_ref.key}
        env.append({"name": "KEMBED_GATEWAY_API_KEY", "valueFrom": {"secretKeyRef": ref}})
    # Sent to whatever revision serves: a worker without a token ignores it.
    return env + worker_token_env(spec, "KEMBED_GATEWAY_WORKER_AUTH_TOKEN")


def prompts_json(prompts: dict[str, str]) -> str:
    """The gateway's --prompts value (KEMBED_GATEWAY_PROMPTS), also given to the golden Job."""
    return json.dumps(dict(sorted(prompts.items())))


def gateway_deployment(
    owner: Owner, spec: EmbeddingModelSpec, revision: str, image: str, component: str = "gateway"
) -> dict[str, Any]:
    """The gateway pointed at `revision`'s workers. Switching revisions changes the pod template, so
    the Deployment rolls: a new pod is Ready (/ready: a worker answered) before an old one stops, and
    an old one leaves the Service endpoints (preStop sleep) before it drains its requests.

    With `component` n.BULK_GATEWAY, the bulk gateway (trafficClasses.bulkGateway): the same pod
    template under its own name, labels and replica count."""
    g = spec.gateway
    tmp_volume, tmp_mount = scratch()
    http = {"port": "http"}
    container = {
        "name": "gateway",
        "image": image,
        "imagePullPolicy": g.image_pull_policy,
        "command": ["kembed-gateway"],
        "env": gateway_env(owner, spec, revision) + pf.env(g),  # the spec's last (the CRD refuses our names)
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "resources": placement.gateway_resources(g, spec.traffic_classes, resources(g.resources)),
        "securityContext": pf.container_security(),
        "volumeMounts": [model_mount(spec.model.source), tmp_mount],
        "startupProbe": {"httpGet": {"path": "/health"} | http, "periodSeconds": 2, "failureThreshold": 60},
        "readinessProbe": {"httpGet": {"path": "/ready"} | http, "periodSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/health"} | http, "periodSeconds": 10, "failureThreshold": 3},
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
    }
    if g.env_from:  # the gateway's own variables are all in env, which wins over any envFrom
        container["envFrom"] = pf.env_from(g)
    replicas = g.replicas if component == "gateway" else bulk_gateway_replicas(spec)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, n.gateway_name(owner, component), component),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": n.selector(owner, component)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "minReadySeconds": 2,
            "template": {
                "metadata": pf.template_metadata(g, n.labels(owner, component), {n.REVISION_LABEL: revision}),
                "spec": pod_spec(
                    [container],
                    [model_volume(spec.model.source), tmp_volume],
                    g.security_context,
                    # the preStop sleep, then the requests in flight finish (placement.py)
                    terminationGracePeriodSeconds=placement.gateway_grace_s(g),
                    **placement.pod_placement(g, n.selector(owner, component), is_rolling=True),
                    **pf.pod_fields(g),
                ),
            },
        },
    }


def bulk_gateway_replicas(spec: EmbeddingModelSpec) -> int:
    bulk = spec.traffic_classes.bulk_gateway
    assert bulk is not None, "rendered only when trafficClasses.bulkGateway is set"
    return bulk.replicas


def gateway_components(spec: EmbeddingModelSpec) -> tuple[str, ...]:
    """The gateways the spec wants: the main one, and the bulk one when trafficClasses.bulkGateway is set;
    none of its own behind a shared endpoint (endpoint.py)."""
    if spec.endpoint:
        return ()
    return ("gateway", n.BULK_GATEWAY) if spec.traffic_classes.bulk_gateway is not None else ("gateway",)


def gateway_service(owner: Owner, spec: EmbeddingModelSpec, component: str = "gateway") -> dict[str, Any]:
    """The Service of the gateway (or, with n.BULK_GATEWAY, of the bulk gateway: same type and port)."""
    svc = spec.gateway.service
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, n.gateway_name(owner, component), component),
        "spec": {
            "type": svc.type,
            "selector": n.selector(owner, component),
            "ports": [{"name": "http", "port": svc.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def gateway_url(owner: Owner, spec: EmbeddingModelSpec, component: str = "gateway") -> str:
    port = spec.gateway.service.port
    suffix = "" if port == 80 else f":{port}"
    return f"http://{n.gateway_name(owner, component)}.{owner.namespace}.svc{suffix}"


def monitor_metadata(owner: Owner, name: str, component: str, spec: EmbeddingModelSpec) -> dict[str, Any]:
    """A monitor's metadata: ours, plus the labels the user's Prometheus selects monitors by (ours win
    on a clash: the dashboards and the operator rely on them)."""
    meta = metadata(owner, name, component)
    meta["labels"] = {**spec.metrics.labels, **meta["labels"]}
    return meta


def worker_pod_monitor(owner: Owner, spec: EmbeddingModelSpec) -> dict[str, Any]:
    """Scrapes every worker pod of the model, all revisions (a headless Service per revision would
    need one ServiceMonitor each; pods carry the revision label for the dashboards)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": monitor_metadata(owner, f"{owner.name}-worker", "worker", spec),
        "spec": {
            "selector": {"matchLabels": n.selector(owner, "worker")},
            "podMetricsEndpoints": [
                {"port": "metrics", "path": "/metrics", "interval": spec.metrics.interval}
            ],
        },
    }


def service_monitor(owner: Owner, spec: EmbeddingModelSpec, component: str = "gateway") -> dict[str, Any]:
    """Scrapes the gateway's Service (or, with n.BULK_GATEWAY, the bulk gateway's)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": monitor_metadata(owner, n.gateway_name(owner, component), component, spec),
        "spec": {
            "selector": {"matchLabels": n.selector(owner, component)},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": spec.metrics.interval}],
        },
    }
