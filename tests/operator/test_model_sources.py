"""Hugging Face Hub and S3 sources in the operator: revisions include what the source resolved to (and
revisions of the older sources keep their hashes); the resolve Job, the pods' fetch init container and
the cache Job as rendered (golden, valid Kubernetes): each fetches what was resolved with its pin, and
each has a deadline; and against the fake API: resolved before any pod, a failure named in
ModelFetchFailed at once and counted once, a Job past its deadline named so, a cache filled before the
pods exist, an S3 pin recorded and kept while the resolution is unchanged."""

from __future__ import annotations

import copy
import json
import os

import kubernetes_validate
import pytest
import yaml
from operator_fakes import IMAGES, Driver, example

from kembed.operator.build import manifests as m
from kembed.operator.build import model_fetch as mf
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.metrics import OperatorMetrics
from kembed.operator.spec.spec import parse_spec

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")
IMAGE = "registry.test/kembed/worker:1"
SHA = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
# Revisions of the examples as hashed before these sources existed: an operator upgrade must not
# roll any of them out.
KEPT = {
    "bge-m3-gpu.yaml": "11c02ca5",
    "minilm-cpu.yaml": "40eca2e2",
    "platform-gpu.yaml": "07ddfcb3",
    "your-model-image.yaml": "1e814bc9",
    "your-model-pvc.yaml": "ba3e4311",
}
HUB = {"huggingFace": {"repo": "sentence-transformers/all-MiniLM-L6-v2", "revision": "main"}}


@pytest.mark.parametrize("name", KEPT, ids=KEPT)
def test_revisions_of_mounted_sources_keep_their_hashes(name):
    assert revision_of(parse_spec(example(name)["spec"]), IMAGE) == KEPT[name]


def hub_spec(**source) -> dict:
    spec = copy.deepcopy(example("minilm-cpu.yaml")["spec"])
    spec["model"]["source"] = {"huggingFace": HUB["huggingFace"] | source}
    return spec


def test_what_a_source_resolved_to_is_in_the_revision_and_how_often_it_is_looked_at_is_not():
    base = revision_of(parse_spec(hub_spec()), IMAGE, SHA)
    assert revision_of(parse_spec(hub_spec()), IMAGE, "0" * 40) != base
    assert revision_of(parse_spec(hub_spec(refreshSeconds=3600)), IMAGE, SHA) == base
    assert revision_of(parse_spec(hub_spec(files=["*.safetensors", "*.json"])), IMAGE, SHA) != base
    assert revision_of(parse_spec(hub_spec(repo="acme/minilm")), IMAGE, SHA) != base


S3_PIN = '{"by":"version","objects":{"config.json":"v-3HL4kqtJlcpXroDTDmJ","model.safetensors":"v-9Ah2"}}'


def render(name: str, resolved: str, pin: str = "") -> list[dict]:
    spec = parse_spec(example(name)["spec"])
    rev = revision_of(spec, IMAGE, resolved)
    objects = [
        mf.resolve_job(OWNER, spec, mf.source_key(spec.model, 0), IMAGE),
        mf.with_fetch(m.worker_deployment(OWNER, spec, rev, IMAGE), spec, resolved, pin=pin),
        mf.with_fetch(
            m.gateway_deployment(OWNER, spec, rev, "registry.test/kembed/gateway:1"),
            spec,
            resolved,
            pin=pin,
            skip_weights=True,
        ),
    ]
    if spec.model.cache is not None:
        objects.append(mf.cache_job(OWNER, spec, rev, resolved, IMAGE, pin))
    return objects


CASES = {"huggingface-hub.yaml": (SHA, ""), "s3-cache.yaml": ("etags-sha256:" + "ab" * 16, S3_PIN)}


@pytest.mark.parametrize("name", CASES, ids=CASES)
def test_fetch_manifests_match_golden_and_are_valid_kubernetes(name):
    objects = render(name, *CASES[name])
    text = yaml.safe_dump_all(objects, sort_keys=False, width=110)
    path = os.path.join(GOLDEN, name)
    if os.environ.get("KEMBED_UPDATE_GOLDEN") == "1":
        with open(path, "w") as out:
            out.write(text)
    with open(path) as golden:
        assert golden.read() == text, (
            "rendered manifests changed: rerun with KEMBED_UPDATE_GOLDEN=1 and review"
        )
    for doc in objects:
        for version in ("1.31.0", "1.35.0"):
            kubernetes_validate.validate(doc, version, strict=True)


def test_each_pod_fetches_what_was_resolved_before_its_container_starts():
    worker, gateway = render("huggingface-hub.yaml", SHA)[1:3]
    for body, skips in ((worker, False), (gateway, True)):
        pod = body["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert init["image"] == pod["containers"][0]["image"], "the pod's own image runs the fetch"
        assert init["command"][:3] == ["kembed-worker", "fetch-model", "hf://BAAI/bge-m3@main"]
        assert init["command"][init["command"].index("--expect") + 1] == SHA
        assert "--pin" not in init["command"], "the Hub's commit sha is its own pin"
        assert ("--skip-weights" in init["command"]) is skips
        token = next(e for e in init["env"] if e["name"] == "HF_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
        assert "HF_TOKEN" not in {e["name"] for e in pod["containers"][0]["env"]}, "serving never sees it"
        assert {"name": "model", "emptyDir": {}} in pod["volumes"]
        mount = next(v for v in pod["containers"][0]["volumeMounts"] if v["name"] == "model")
        assert (mount["subPath"], mount["readOnly"]) == ("model", True)


def test_with_a_cache_every_pod_mounts_the_revisions_directory_read_only():
    resolved, pin = CASES["s3-cache.yaml"]
    _, worker, gateway, cache = render("s3-cache.yaml", resolved, pin)
    spec = parse_spec(example("s3-cache.yaml")["spec"])
    directory = mf.cache_dir(spec.model, resolved)
    for body in (worker, gateway):
        pod = body["spec"]["template"]["spec"]
        assert "initContainers" not in pod
        volume = next(v for v in pod["volumes"] if v["name"] == "model")
        assert volume["persistentVolumeClaim"] == {"claimName": "kembed-model-cache", "readOnly": True}
        mount = next(v for v in pod["containers"][0]["volumeMounts"] if v["name"] == "model")
        assert mount["subPath"] == directory
    command = cache["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--dest") + 1] == f"/cache/{directory}"
    assert command[command.index("--expect") + 1] == resolved
    assert command[command.index("--pin") + 1] == pin, "the cache fetches the pinned objects"
    env = {e["name"]: e for e in cache["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "s3-model-reader"


def test_every_fetch_has_a_deadline_of_its_own_and_every_job_one_for_all_its_attempts():
    resolve, worker, gateway, cache = render("s3-cache.yaml", *CASES["s3-cache.yaml"])
    hub_worker = render("huggingface-hub.yaml", SHA)[1]

    def deadline(command: list[str]) -> int:
        return int(command[command.index("--deadline-s") + 1])

    resolve_command = resolve["spec"]["template"]["spec"]["containers"][0]["command"]
    assert deadline(resolve_command) == mf.RESOLVE_DEADLINE_S
    retries = resolve["spec"]["backoffLimit"]
    # three attempts, their back-off (10 s, 20 s) and 10 s for each pod's start fit the Job's deadline
    budget = (retries + 1) * (mf.RESOLVE_DEADLINE_S + 10) + 30
    assert budget <= resolve["spec"]["activeDeadlineSeconds"] <= 300
    cache_command = cache["spec"]["template"]["spec"]["containers"][0]["command"]
    assert deadline(cache_command) == mf.FETCH_DEADLINE_S
    assert cache["spec"]["activeDeadlineSeconds"] > (cache["spec"]["backoffLimit"] + 1) * mf.FETCH_DEADLINE_S
    (init,) = hub_worker["spec"]["template"]["spec"]["initContainers"]
    assert deadline(init["command"]) == mf.FETCH_DEADLINE_S, "an init container's deadline is its own"
    assert "activeDeadlineSeconds" not in hub_worker["spec"]["template"]["spec"], "it would end the worker"
    for body in (worker, gateway):
        assert "initContainers" not in body["spec"]["template"]["spec"], "with a cache the pods fetch nothing"


# --- against the fake API ---------------------------------------------------------------------


def finish_resolve(driver: Driver, report: dict, succeeded: bool = True) -> None:
    (job,) = driver.cluster.named("Job", mf.RESOLVE)
    stamp = driver.now.strftime("%Y-%m-%dT%H:%M:%SZ")
    job["status"] = {
        "conditions": [
            {
                "type": "Complete" if succeeded else "Failed",
                "status": "True",
                "lastTransitionTime": stamp,
                "message": "exit code 1",
            }
        ]
    }
    name = job["metadata"]["name"] + "-pod"
    driver.cluster.objects[("Pod", "ml", name)] = {
        "metadata": {
            "name": name,
            "uid": f"{name}-uid",
            "labels": job["spec"]["template"]["metadata"]["labels"],
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "resolve",
                    "state": {
                        "terminated": {"exitCode": 0 if succeeded else 1, "message": json.dumps(report)}
                    },
                }
            ]
        },
    }


def test_a_hub_source_is_resolved_before_any_pod_and_its_commit_makes_the_revision():
    driver = Driver(hub_spec())
    status = driver.step()
    assert driver.cluster.named("Job", mf.RESOLVE) and not driver.cluster.named("Deployment", "worker")
    assert (status["phase"], driver.condition("Ready")["reason"]) == ("Pending", "ResolvingModel")
    finish_resolve(
        driver, {"ok": True, "resolved": SHA, "source": "hf://sentence-transformers/all-MiniLM-L6-v2@main"}
    )
    status = driver.step()
    revision = revision_of(parse_spec(hub_spec()), IMAGES.worker, SHA)
    assert status["candidateRevision"] == revision
    assert status["model"]["resolved"] == SHA and status["model"]["revisions"] == {revision: SHA}
    assert not driver.cluster.named("Job", mf.RESOLVE), "its answer is recorded, the Job deleted"
    (workers,) = driver.cluster.named("Deployment", "worker", revision)
    init = workers["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][init["command"].index("--expect") + 1] == SHA
    assert driver.condition("ModelFetchFailed")["status"] == "False"
    driver.step()
    assert not driver.cluster.named("Job", mf.RESOLVE), "resolved once for this source"


def test_a_failed_resolve_is_named_in_the_condition_at_once_and_counted_once():
    metrics = OperatorMetrics()
    driver = Driver(hub_spec(repo="acme/gated"), metrics.hooks())
    driver.step()
    message = "hf://acme/gated@main/config.json: a gated repository: accept its terms ..."
    report = {
        "ok": False,
        "reason": "forbidden",
        "object": "config.json",
        "message": message,
        "source": "hf://acme/gated@main",
    }
    finish_resolve(driver, report, succeeded=False)
    driver.step()
    driver.step()
    failed = driver.condition("ModelFetchFailed")
    assert (failed["status"], failed["reason"]) == ("True", "Forbidden")
    assert "hf://acme/gated@main" in failed["message"] and "config.json" in failed["message"]
    assert driver.condition("Ready")["reason"] == "ModelFetchFailed"
    labels = {"source": "huggingFace", "reason": "forbidden"}
    assert metrics.registry.get_sample_value("kembed_operator_model_fetch_failures_total", labels) == 1
    driver.step(seconds=61)  # a minute on: tried again (a token fixed, terms accepted)
    driver.step()
    (retry,) = driver.cluster.named("Job", mf.RESOLVE)
    assert "status" not in retry
    assert driver.condition("ModelFetchFailed")["status"] == "True", "until a resolve succeeds"


def test_a_pods_failed_fetch_is_named_in_the_condition():
    driver = Driver(hub_spec())
    driver.step()
    finish_resolve(driver, {"ok": True, "resolved": SHA})
    revision = driver.step()["candidateRevision"]
    driver.cluster.run_workers(revision, ready=False)
    pod = next(o for (k, _, _), o in driver.cluster.objects.items() if k == "Pod" and o.get("_owner"))
    report = {
        "ok": False,
        "reason": "disk_full",
        "object": "model.safetensors",
        "source": "hf://x@main",
        "message": "90868376 bytes to fetch, 1024 free in /models",
    }
    pod["status"]["initContainerStatuses"] = [
        {
            "name": mf.INIT_CONTAINER,
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "message": json.dumps(report)}},
        }
    ]
    driver.step()
    failed = driver.condition("ModelFetchFailed")
    assert (failed["status"], failed["reason"]) == ("True", "DiskFull")
    assert "model.safetensors" in failed["message"] and pod["metadata"]["name"] in failed["message"]


def test_with_a_cache_the_pods_are_made_once_their_cache_job_is_complete():
    spec = hub_spec()
    spec["model"]["cache"] = {"claimName": "cache"}
    driver = Driver(spec)
    driver.step()
    finish_resolve(driver, {"ok": True, "resolved": SHA})
    revision = driver.step()["candidateRevision"]
    (cache,) = driver.cluster.named("Job", mf.CACHE, revision)
    assert not driver.cluster.named("Deployment", "worker"), "no pod before the cache is filled"
    cache["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    driver.step()
    (workers,) = driver.cluster.named("Deployment", "worker", revision)
    volume = next(v for v in workers["spec"]["template"]["spec"]["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"]["claimName"] == "cache"


def test_a_refresh_resolves_again_while_the_old_resolution_keeps_serving():
    driver = Driver(hub_spec(refreshSeconds=600))
    driver.step()
    finish_resolve(driver, {"ok": True, "resolved": SHA})
    first = driver.step()["candidateRevision"]
    driver.step(seconds=600)
    assert driver.cluster.named("Job", mf.RESOLVE), "a new interval: resolved again"
    assert driver.body["status"]["model"]["resolved"] == SHA and driver.cluster.named(
        "Deployment", "worker", first
    )
    finish_resolve(driver, {"ok": True, "resolved": "2" * 40})
    status = driver.step()
    assert status["model"]["resolved"] == "2" * 40
    assert revision_of(parse_spec(hub_spec()), IMAGES.worker, "2" * 40) in {
        status["candidateRevision"],
        status.get("activeRevision"),
    }


def s3_spec() -> dict:
    spec = copy.deepcopy(example("minilm-cpu.yaml")["spec"])
    spec["model"]["source"] = {"s3": {"bucket": "models", "prefix": "minilm/", "refreshSeconds": 600}}
    return spec


def worker_init(driver: Driver, revision: str) -> list[str]:
    (workers,) = driver.cluster.named("Deployment", "worker", revision)
    return workers["spec"]["template"]["spec"]["initContainers"][0]["command"]


def test_an_s3_pin_goes_to_the_pods_and_an_unchanged_resolution_keeps_it_and_its_revision():
    driver = Driver(s3_spec())
    driver.step()
    digest = "etags-sha256:" + "cd" * 16
    finish_resolve(driver, {"ok": True, "resolved": digest, "pin": S3_PIN})
    status = driver.step()
    revision = status["candidateRevision"]
    assert status["model"]["pins"] == {digest: S3_PIN}
    command = worker_init(driver, revision)
    assert command[command.index("--expect") + 1] == digest
    assert command[command.index("--pin") + 1] == S3_PIN
    (workers,) = driver.cluster.named("Deployment", "worker", revision)
    template = copy.deepcopy(workers["spec"]["template"])
    # A refresh: the same objects (a README changed beside them), re-uploaded copies with new
    # VersionIds: the same digest, and the pods keep the pin they had, so nothing rolls.
    driver.step(seconds=600)
    finish_resolve(driver, {"ok": True, "resolved": digest, "pin": S3_PIN.replace("v-9Ah2", "v-new")})
    status = driver.step()
    assert status["candidateRevision"] == revision and status["model"]["pins"] == {digest: S3_PIN}
    (workers,) = driver.cluster.named("Deployment", "worker", revision)
    assert workers["spec"]["template"] == template, "an unchanged source leaves the pods as they are"
    # A fetched object replaced: a new digest, a new revision with its own pin; the old kept beside.
    driver.step(seconds=600)
    moved, moved_pin = "etags-sha256:" + "ef" * 16, S3_PIN.replace("v-3HL4kqtJlcpXroDTDmJ", "v-pushed")
    finish_resolve(driver, {"ok": True, "resolved": moved, "pin": moved_pin})
    status = driver.step()
    candidate = status["candidateRevision"]
    assert candidate != revision
    assert worker_init(driver, candidate)[worker_init(driver, candidate).index("--pin") + 1] == moved_pin
    assert set(status["model"]["pins"]) <= set(status["model"]["revisions"].values()) | {moved}


def test_a_resolve_job_past_its_deadline_is_named_so():
    driver = Driver(hub_spec())
    driver.step()
    finish_resolve(driver, {}, succeeded=False)
    (job,) = driver.cluster.named("Job", mf.RESOLVE)
    job["status"]["conditions"][0] |= {
        "reason": "DeadlineExceeded",
        "message": "Job was active longer than specified deadline",
    }
    driver.step()
    failed = driver.condition("ModelFetchFailed")
    assert (failed["status"], failed["reason"]) == ("True", "DeadlineExceeded")
    assert f"{mf.RESOLVE_TIMEOUT_S} s" in failed["message"]


def test_a_pods_fetch_past_its_own_deadline_is_deadline_exceeded():
    driver = Driver(hub_spec())
    driver.step()
    finish_resolve(driver, {"ok": True, "resolved": SHA})
    revision = driver.step()["candidateRevision"]
    driver.cluster.run_workers(revision, ready=False)
    pod = next(o for (k, _, _), o in driver.cluster.objects.items() if k == "Pod" and o.get("_owner"))
    report = {
        "ok": False,
        "reason": "deadline",
        "object": "",
        "source": "hf://sentence-transformers/all-MiniLM-L6-v2@main",
        "message": "not done within its deadline of 3600 s (--deadline-s); what was fetched is staged",
    }
    pod["status"]["initContainerStatuses"] = [
        {
            "name": mf.INIT_CONTAINER,
            "restartCount": 1,
            "state": {"terminated": {"exitCode": 2, "message": json.dumps(report)}},
        }
    ]
    driver.step()
    failed = driver.condition("ModelFetchFailed")
    assert (failed["status"], failed["reason"]) == ("True", "DeadlineExceeded")
