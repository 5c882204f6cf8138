"""Pure builders of the rollout Jobs: the worker image's own `prewarm` and `smoke` commands.

The operator lists the candidate revision's ready pods and passes each one's address as a
`--target` (a Service name would reach only one pod, and every pod captures its own graphs). The
prewarm Job also reads the serving revision's hottest buckets from each of its pods (`--hot-from`).
A worker pod already captured every reachable bucket when it started (`graphs.startupPrewarm: all`,
the default), so there the Job finds them captured (it is idempotent); it captures what a `listed`
or `none` start-up, or one whose `prewarmSeconds` ran out, left.
The golden Job (rollout.golden, on by default) runs beside the smoke Job from the gateway image:
it tokenizes fixed texts with the gateway's own tokenizer and settings (maximum length, prompts),
embeds them on every candidate pod, normalises them as the gateway would, and prints the answer,
which the operator judges against the record of the same weights (golden.py).
Exit 1 is a verdict (a bucket failed, pods disagree) and fails the Job at once; exit 2 (a worker
unreachable) is retried twice by the Job controller before the Job fails. `activeDeadlineSeconds` is
the timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kembed.operator.build import manifests as m
from kembed.operator.build import naming as n
from kembed.operator.build import pod_fields as pf
from kembed.operator.build.naming import Owner
from kembed.operator.spec.spec import EmbeddingModelSpec

GOLDEN_MOUNT = "/etc/kembed/golden"
MAX_UNREACHABLE_RETRIES = 2


@dataclass(frozen=True)
class JobRequest:
    """A rollout Job the state machine wants to exist."""

    kind: str  # "prewarm", "smoke" or "golden"
    revision: str
    attempt: int
    targets: tuple[str, ...]  # candidate pods, host:port
    hot_from: tuple[str, ...] = ()  # serving pods to read hot buckets from (prewarm only)

    def name(self, owner: Owner) -> str:
        return n.job_name(owner, self.kind, self.revision, self.attempt)


def command(spec: EmbeddingModelSpec, request: JobRequest) -> list[str]:
    if request.kind == "golden":
        args = ["python", "-P", "-m", "kembed.gateway.golden", "--model", m.MODEL_MOUNT]
        for target in request.targets:
            args += ["--target", target]
        # The gateway's own tokenization settings, as its env gives them (manifests.gateway_env): the
        # check embeds what clients of this revision would get. Pooling and normalisation are the
        # workers' (their pods answer with them; the tool normalises as their Info says).
        if spec.model.max_sequence_length is not None:
            args += ["--max-seq-length", str(spec.model.max_sequence_length)]
        if spec.model.prompts:
            args += ["--prompts", m.prompts_json(spec.model.prompts)]
        return [*args, "--min-cosine", repr(spec.rollout.min_cosine), "--timeout", "120"]
    args = ["kembed-worker", request.kind]
    for target in request.targets:
        args += ["--target", target]
    if request.kind == "prewarm":
        timeout = spec.rollout.prewarm_timeout_seconds
        if spec.graphs.prewarm_buckets:
            args += ["--buckets", ",".join(spec.graphs.prewarm_buckets)]
        if request.hot_from and spec.graphs.hot_buckets > 0:
            for source in request.hot_from:
                args += ["--hot-from", source]
            args += ["--hot", str(spec.graphs.hot_buckets)]
    else:
        timeout = spec.rollout.smoke_timeout_seconds
        if spec.rollout.smoke_buckets:
            args += ["--buckets", ",".join(spec.rollout.smoke_buckets)]
        args += ["--min-cosine", repr(spec.rollout.min_cosine)]
        if m.worker_device(spec) == "cuda":  # a GPU pod that serves on its CPU fails the gate
            args += ["--expect-device", "cuda"]
        if spec.rollout.golden_config_map:
            args += ["--golden", GOLDEN_MOUNT]
    return [*args, "--timeout", str(timeout)]


# The golden Job hashes the weight files (~1-2 s a GB on a core) and holds the tokenizer (BGE-M3's
# vocabulary of 250k tokens takes ~300 MiB).
GOLDEN_RESOURCES = {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
TOOL_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def job(
    owner: Owner, spec: EmbeddingModelSpec, request: JobRequest, image: str, gateway_image: str = ""
) -> dict[str, Any]:
    """The Job; a golden one runs `gateway_image` (the gateway's tokenizer), the others `image`."""
    timeout = (
        spec.rollout.prewarm_timeout_seconds
        if request.kind == "prewarm"
        else spec.rollout.smoke_timeout_seconds
    )
    tmp_volume, tmp_mount = m.scratch()
    volumes, mounts = [tmp_volume], [tmp_mount]
    if request.kind == "smoke" and spec.rollout.golden_config_map:
        volumes.append({"name": "golden", "configMap": {"name": spec.rollout.golden_config_map}})
        mounts.append({"name": "golden", "mountPath": GOLDEN_MOUNT, "readOnly": True})
    is_golden = request.kind == "golden"
    if is_golden:  # the model directory, as the gateway mounts it
        volumes.append(m.model_volume(spec.model.source))
        mounts.append(m.model_mount(spec.model.source))
    container = {
        "name": request.kind,
        "image": gateway_image if is_golden else image,
        "imagePullPolicy": spec.gateway.image_pull_policy if is_golden else spec.worker.image_pull_policy,
        "command": command(spec, request),
        "env": m.base_env() + m.worker_token_env(spec, "KEMBED_WORKER_AUTH_TOKEN"),  # read by the tools
        "resources": GOLDEN_RESOURCES if is_golden else TOOL_RESOURCES,
        "securityContext": pf.container_security(),
        "volumeMounts": mounts,
        # The command's report (which bucket failed, its cosine) becomes the pod's termination
        # message, which the operator copies into the RolloutBlocked condition: no log access needed.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    meta = m.metadata(owner, request.name(owner), request.kind, request.revision)
    meta["labels"][n.ATTEMPT_LABEL] = str(request.attempt)
    labels = n.labels(owner, request.kind, request.revision) | {n.ATTEMPT_LABEL: str(request.attempt)}
    # The prewarm and smoke pods run the worker image, as the workers' service account and user; the
    # golden pod is a gateway's: its image, and the model volume mounted where the gateway's is (its
    # placement: a hostPath model is on the nodes the gateway is put on, a CSI volume may need its
    # service account).
    w = spec.gateway if is_golden else spec.worker
    fields = pf.golden_pod_fields(spec.gateway) if is_golden else pf.job_pod_fields(spec.worker)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": MAX_UNREACHABLE_RETRIES,
            "activeDeadlineSeconds": timeout,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": request.kind, "operator": "In", "values": [1]},
                    },
                ]
            },
            "template": {
                "metadata": pf.template_metadata(w, labels),
                "spec": m.pod_spec([container], volumes, w.security_context, restartPolicy="Never", **fields),
            },
        },
    }
