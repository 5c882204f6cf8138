"""A revision: a short hash of everything that shapes a worker pod, and nothing that does not.

Image, model (source, dtype, pooling, prompts, ...), engine settings (backend, buckets, batch limits,
pinned-memory cap, CUDA graphs, the workers' side of the traffic classes), resources and placement are
in it, and so are the pod settings that decide whether and how a worker runs: its service account
(what it is granted: an SCC, a pod identity), runtime class (whether the container sees the GPU), env
and envFrom (a variable can change what the engine does) and security context (who may read the model
and write the kernel cache). `worker.replicas` is not — scaling is never a rollout — and neither are
the gateway, graph-prewarm and rollout settings, which change how a revision is served or gated, not
what it computes, nor the workers' disruption budget (a separate object, updated in place), nor the
pods' image pull secrets, labels and annotations (NOT_IN_REVISION): they change how a pod is pulled
or filed, not what it computes, so a change to them need not pass the gates and is not worth a
second set of GPUs; it rolls the current revision's pods in place (the Deployment's own rolling
update; its new pods prewarm before they are ready). Worker fields added later (the priority class,
topology spread, kernel cache claim, and the pod settings above) count only when set away from their
defaults, so that an operator upgrade keeps every revision's hash. The class
rule is in although it changes no output: a worker reads it once, at start, and it decides which
batches (and so which CUDA-graph buckets) the revision runs, so a new rule goes through the same gates.
"""

from __future__ import annotations

import hashlib
import json

from kembed.operator.spec.model_spec import ModelSpec
from kembed.operator.spec.spec import EmbeddingModelSpec, WorkerSpec
from kembed.operator.spec.traffic_spec import WORKER_CLASS_FIELDS, TrafficClassesSpec

REVISION_CHARS = 8  # 32 bits: collisions among one model's handful of revisions are negligible
# Worker fields newer than the first revisions: in the hash only when set away from their defaults.
LATER_WORKER_FIELDS = (
    "auth_token_secret_ref",
    "priority_class_name",
    "topology_spread",
    "kernel_cache_claim",
    "stall_restart_seconds",
    "service_account_name",
    "runtime_class_name",
    "env",
    "env_from",
    "security_context",
)
# Worker fields that are never in the hash: scaling, the image (hashed resolved, below), the budget, and
# the pod fields that do not change what a worker computes (module docstring).
NOT_IN_REVISION = {
    "replicas",
    "image",
    "disruption_budget",
    "image_pull_secrets",
    "pod_labels",
    "pod_annotations",
}


# Model fields newer than the first revisions, likewise.
LATER_MODEL_FIELDS = ("linear_dtype", "cache")
# Sources newer than the first revisions: in the hash only when set. How often one is resolved again
# is not in it (what was resolved is).
LATER_SOURCES = ("hugging_face", "s3")
NOT_IN_SOURCE = {"refresh_seconds"}
# Class fields added after revisions were first hashed (see LATER_WORKER_FIELDS).
LATER_CLASS_FIELDS = ("interactive_lane", "lane_inflight_batches")


def revision_of(spec: EmbeddingModelSpec, worker_image: str, resolved_model: str = "") -> str:
    """The revision `spec` deploys, with `worker_image` the resolved image (spec or operator default)
    and, for a fetched source (Hub, S3), `resolved_model` what its name was resolved to (the commit
    sha, the objects' digest: model_fetch.py), so that new weights behind a branch are a new revision."""
    at_default = {
        name
        for name in LATER_WORKER_FIELDS
        if getattr(spec.worker, name) == WorkerSpec.model_fields[name].get_default(call_default_factory=True)
    }
    model_at_default = {
        name
        for name in LATER_MODEL_FIELDS
        if getattr(spec.model, name) == ModelSpec.model_fields[name].get_default(call_default_factory=True)
    }
    model = spec.model.model_dump(mode="json", exclude=model_at_default)
    for name in LATER_SOURCES:
        if model["source"][name] is None:
            del model["source"][name]
        else:
            model["source"][name] = {k: v for k, v in model["source"][name].items() if k not in NOT_IN_SOURCE}
    if resolved_model:
        model["resolved"] = resolved_model
    shaping = {
        "image": worker_image,
        "model": model,
        "worker": spec.worker.model_dump(mode="json", exclude=NOT_IN_REVISION | at_default),
    }
    # The workers' class rule, left out at its defaults: revisions from before it existed keep their
    # hash, so upgrading the operator rolls no worker out.
    # A field added later is left out at its default too, so a rule set before it keeps its hash.
    classes = spec.traffic_classes.model_dump(mode="json", include=set(WORKER_CLASS_FIELDS))
    defaults = TrafficClassesSpec().model_dump(mode="json", include=set(WORKER_CLASS_FIELDS))
    for name in LATER_CLASS_FIELDS:
        if classes[name] == defaults[name]:
            del classes[name], defaults[name]
    if classes != defaults:
        shaping["traffic_classes"] = classes
    canonical = json.dumps(shaping, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_CHARS]
