"""Pure builders for a fetched model source (`spec.model.source.huggingFace` or `.s3`): the worker
image's own `kembed-worker fetch-model` as a resolve Job, a cache Job, or an init container.

- **Resolve Job** (`<model>-resolve-<key>`): `fetch-model --resolve-only` in the model's namespace, with
  the source's Secret as environment. Its answer (the commit sha, the objects' digest, and for S3 the
  pin: their VersionIds or ETags) is its pod's termination message, which the operator reads
  (model_resolve.py) and hashes into the revision (the pin is not in the hash). The
  operator itself never reads the Secret and never reaches the Hub or the bucket: it needs no Secret
  access, no egress and no storage client, and the answer is what the fetch will see from where it runs
  (the namespace's DNS, proxy, endpoint and NetworkPolicy).
- **Per pod** (no `spec.model.cache`): the pod's `model` volume is an emptyDir, filled by an init
  container running the pod's own image (the worker's, the gateway's: both carry the fetch extra) with
  `--expect` what was resolved (and `--pin`): the Hub commit itself, the pinned S3 objects, never
  the branch or the prefix as they are now; the main container mounts the fetched directory
  read-only. A gateway fetches all but the weights.
- **Cache** (`spec.model.cache.claimName`, ReadWriteMany): one Job per revision fetches into a
  directory of the claim named for the source and what it resolved to; every worker and gateway pod
  of that revision mounts that directory read-only (a subPath), with no init container. The operator
  creates a revision's pods only once its cache Job is Complete (reconcile.py).
- **Deadlines**: every network call of the command waits at most its `--timeout-s` (30 s), and each
  run has a `--deadline-s` of its own, which ends it with its report (exit 2, worth a retry that
  resumes): a resolve RESOLVE_DEADLINE_S, a fetch FETCH_DEADLINE_S. The Jobs also carry an
  activeDeadlineSeconds for all their attempts; an init container cannot (a pod's deadline would
  end its serving container too), so its own deadline is the bound, and the kubelet restarts it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

from kembed.operator.build import manifests as m
from kembed.operator.build import naming as n
from kembed.operator.build import pod_fields as pf
from kembed.operator.build.naming import Owner
from kembed.operator.spec.model_spec import HuggingFaceSource, ModelSpec, S3Source
from kembed.operator.spec.spec import EmbeddingModelSpec

RESOLVE = "model-resolve"  # component label of the resolve Jobs
CACHE = "model-cache"  # and of the cache Jobs
SOURCE_KEY_LABEL = "kembed.dev/source-key"
INIT_CONTAINER = "fetch-model"
FETCH_ROOT = "/models"  # the init container's mount of the model volume; the model is FETCH_ROOT/model
CACHE_ROOT = "/cache"  # the cache Job's mount of the claim
TERMINATION_LOG = "/dev/termination-log"
# A resolve is a listing and a few HEADs (seconds). 75 s per attempt: two calls that each ran into
# the command's 30 s timeout end on their own (Unreachable, not a deadline), and the Job's three
# attempts, their back-off (10 s, 20 s) and their pods' starts fit RESOLVE_TIMEOUT_S.
RESOLVE_DEADLINE_S = 75
RESOLVE_TIMEOUT_S = 300  # the resolve Job's activeDeadlineSeconds
# A fetch run: an hour moves 36 GB at 10 MB/s. A run past it ends (its bytes staged) and the next
# attempt (the kubelet's restart of an init container, a cache Job's retry) resumes from them.
FETCH_DEADLINE_S = 3600
# A fetch verifies as it goes (hashing ~1 GB/s a core) and holds little: 8 parallel streams of 1 MiB.
FETCH_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
RESOLVE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
MAX_TRANSIENT_RETRIES = 2  # exit 2 (network, 5xx) is retried by the Job controller; exit 1 fails at once
# The cache Job's activeDeadlineSeconds: each of its attempts its whole run, and 10 minutes for
# pulling the image and scheduling the pods.
CACHE_JOB_DEADLINE_S = (MAX_TRANSIENT_RETRIES + 1) * FETCH_DEADLINE_S + 600


def source_uri(spec: ModelSpec) -> str:
    source = spec.source.fetched
    if isinstance(source, HuggingFaceSource):
        return f"hf://{source.repo}@{source.revision}"
    assert isinstance(source, S3Source), "only fetched sources have a URI"
    prefix = source.prefix.strip("/")
    return f"s3://{source.bucket}/{prefix + '/' if prefix else ''}"


def source_kind(spec: ModelSpec) -> str:
    return "huggingFace" if spec.source.hugging_face is not None else "s3"


def source_hash(spec: ModelSpec) -> str:
    """What the resolution depends on: the source as written (its refresh interval aside)."""
    source = spec.source.fetched
    assert source is not None
    body = source.model_dump(mode="json", exclude={"refresh_seconds"}) | {"kind": source_kind(spec)}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:10]


def source_key(spec: ModelSpec, epoch: int) -> str:
    """The resolve Job's key: the source, and which refresh interval of it (0 without refreshes)."""
    return hashlib.sha256(f"{source_hash(spec)}/{epoch}".encode()).hexdigest()[:10]


def refresh_epoch(spec: ModelSpec, now_s: float) -> int:
    source = spec.source.fetched
    assert source is not None
    return int(now_s // source.refresh_seconds) if source.refresh_seconds else 0


def cache_dir(spec: ModelSpec, resolved: str) -> str:
    """The claim's directory of one fetch: readable, and distinct for each source, file set and result."""
    source = spec.source.fetched
    assert source is not None
    name = source.repo if isinstance(source, HuggingFaceSource) else f"{source.bucket}/{source.prefix}"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60]
    digest = hashlib.sha256(f"{source_hash(spec)}/{resolved}".encode()).hexdigest()[:12]
    return f"{source_kind(spec).lower()}-{slug}-{digest}"


# --- the command and its environment ------------------------------------------------------------


def fetch_args(
    spec: ModelSpec, *, expect: str = "", pin: str = "", dest: str = "", skip_weights: bool = False
) -> list[str]:
    source = spec.source.fetched
    assert source is not None
    args = ["kembed-worker", "fetch-model", source_uri(spec)]
    args += ["--dest", dest] if dest else ["--resolve-only"]
    if expect:
        args += ["--expect", expect]
    if expect and pin:
        args += ["--pin", pin]
    if source.files:
        args += ["--files", ",".join(source.files)]
    if skip_weights:
        args.append("--skip-weights")
    if isinstance(source, HuggingFaceSource) and source.endpoint:
        args += ["--endpoint", source.endpoint]
    if isinstance(source, S3Source):
        if source.endpoint_url:
            args += ["--endpoint", source.endpoint_url]
        if source.region:
            args += ["--region", source.region]
    deadline_s = FETCH_DEADLINE_S if dest else RESOLVE_DEADLINE_S
    return [*args, "--deadline-s", str(deadline_s), "--report", TERMINATION_LOG]


def fetch_env(spec: ModelSpec) -> list[dict[str, Any]]:
    """The source's Secret as the clients' own variables (the operator never reads it)."""
    env: list[dict[str, Any]] = [*m.base_env(), {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
    hub, s3 = spec.source.hugging_face, spec.source.s3
    if hub is not None and hub.token_secret_ref is not None:
        ref = hub.token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if s3 is not None and s3.credentials_secret_ref is not None:
        ref2 = s3.credentials_secret_ref
        for name, key in (
            ("AWS_ACCESS_KEY_ID", ref2.access_key_id_key),
            ("AWS_SECRET_ACCESS_KEY", ref2.secret_access_key_key),
        ):
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": ref2.name, "key": key}}})
    return env


def _container(name: str, image: str, pull_policy: str, args: list[str], spec: ModelSpec) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": args,
        "env": fetch_env(spec),
        "securityContext": pf.container_security(),
        # The command writes its JSON outcome there; its log tail if it died before it could.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


# --- Jobs ----------------------------------------------------------------------------------------


def resolve_job_name(owner: Owner, key: str) -> str:
    return f"{owner.name}-resolve-{key}"


def cache_job_name(owner: Owner, revision: str) -> str:
    return f"{owner.name}-model-{revision}"


def _job(
    owner: Owner,
    spec: EmbeddingModelSpec,
    name: str,
    labels: dict[str, str],
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
    deadline_s: int,
) -> dict[str, Any]:
    meta = m.metadata(owner, name, labels[n.COMPONENT_LABEL], labels.get(n.REVISION_LABEL))
    meta["labels"] |= labels
    w = spec.worker  # the workers' image, account (a pod identity for S3), user and pull secrets
    job_spec: dict[str, Any] = {
        "backoffLimit": MAX_TRANSIENT_RETRIES,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": container["name"], "operator": "In", "values": [1]},
                }
            ]
        },
        "template": {
            "metadata": pf.template_metadata(w, {**n.labels(owner, labels[n.COMPONENT_LABEL]), **labels}),
            "spec": m.pod_spec(
                [container], volumes, w.security_context, restartPolicy="Never", **pf.job_pod_fields(w)
            ),
        },
    }
    job_spec["activeDeadlineSeconds"] = deadline_s  # all its attempts; each has the command's own
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}


def resolve_job(owner: Owner, spec: EmbeddingModelSpec, key: str, image: str) -> dict[str, Any]:
    """`fetch-model --resolve-only`: lists the source (and checks that it can be read) in seconds."""
    tmp_volume, tmp_mount = m.scratch()
    container = _container(
        "resolve", image, spec.worker.image_pull_policy, fetch_args(spec.model), spec.model
    )
    container |= {"resources": RESOLVE_RESOURCES, "volumeMounts": [tmp_mount]}
    labels = {n.COMPONENT_LABEL: RESOLVE, SOURCE_KEY_LABEL: key}
    return _job(owner, spec, resolve_job_name(owner, key), labels, container, [tmp_volume], RESOLVE_TIMEOUT_S)


def cache_job(
    owner: Owner, spec: EmbeddingModelSpec, revision: str, resolved: str, image: str, pin: str = ""
) -> dict[str, Any]:
    """The revision's fetch into the cache claim: each attempt within FETCH_DEADLINE_S, a retry
    resuming from the bytes staged on the claim, all of them within CACHE_JOB_DEADLINE_S."""
    cache = spec.model.cache
    assert cache is not None
    tmp_volume, tmp_mount = m.scratch()
    dest = f"{CACHE_ROOT}/{cache_dir(spec.model, resolved)}"
    args = fetch_args(spec.model, expect=resolved, pin=pin, dest=dest)
    container = _container("fetch", image, spec.worker.image_pull_policy, args, spec.model)
    container |= {
        "resources": FETCH_RESOURCES,
        "volumeMounts": [{"name": "model-cache", "mountPath": CACHE_ROOT}, tmp_mount],
    }
    volume = {"name": "model-cache", "persistentVolumeClaim": {"claimName": cache.claim_name}}
    labels = {n.COMPONENT_LABEL: CACHE, n.REVISION_LABEL: revision}
    volumes = [volume, tmp_volume]
    return _job(
        owner, spec, cache_job_name(owner, revision), labels, container, volumes, CACHE_JOB_DEADLINE_S
    )


# --- pods ----------------------------------------------------------------------------------------


def with_fetch(
    body: dict[str, Any],
    spec: EmbeddingModelSpec,
    resolved: str,
    *,
    pin: str = "",
    skip_weights: bool = False,
) -> dict[str, Any]:
    """`body` (a Deployment or Job) with its `model` volume made the fetched model: an emptyDir filled
    by an init container fetching `resolved` (with its `pin`), or the cache claim's directory of
    `resolved`. Unchanged for a mounted source or a body without that volume."""
    if spec.model.source.fetched is None or not resolved:
        return body
    body = copy.deepcopy(body)
    pod = body["spec"]["template"]["spec"]
    index = next((i for i, v in enumerate(pod["volumes"]) if v["name"] == "model"), None)
    if index is None:
        return body
    main = pod["containers"][0]
    mount = next(v for v in main["volumeMounts"] if v["name"] == "model")
    cache = spec.model.cache
    if cache is not None:
        pod["volumes"][index] = {
            "name": "model",
            "persistentVolumeClaim": {"claimName": cache.claim_name, "readOnly": True},
        }
        mount["subPath"] = cache_dir(spec.model, resolved)
        return body
    pod["volumes"][index] = {"name": "model", "emptyDir": {}}
    mount["subPath"] = "model"
    dest = f"{FETCH_ROOT}/model"
    args = fetch_args(spec.model, expect=resolved, pin=pin, dest=dest, skip_weights=skip_weights)
    init = _container(
        INIT_CONTAINER, main["image"], main.get("imagePullPolicy", "IfNotPresent"), args, spec.model
    )
    tmp = next((v for v in main["volumeMounts"] if v["name"] == "tmp"), None)
    init |= {
        "resources": FETCH_RESOURCES,
        "volumeMounts": [{"name": "model", "mountPath": FETCH_ROOT}, *([tmp] if tmp else [])],
    }
    pod["initContainers"] = [init, *pod.get("initContainers", [])]
    return body
