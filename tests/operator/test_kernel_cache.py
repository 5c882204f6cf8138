"""The kernels a worker compiles (FlashAttention 4's, Triton's) are kept: in the pod's /tmp by
default, on the claim `worker.kernelCacheClaim` names when set, which pods of every revision share."""

from __future__ import annotations

import kubernetes_validate
import pydantic
import pytest
from operator_fakes import example

from kembed.operator.build import manifests as m
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.spec.spec import parse_spec

IMAGE = "registry.test/kembed/worker:1"
OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")


def worker(claim: str | None) -> tuple[str, dict]:
    body = example("bge-m3-gpu.yaml")["spec"]
    if claim is not None:
        body["worker"] = body.get("worker", {}) | {"kernelCacheClaim": claim}
    spec = parse_spec(body)
    rev = revision_of(spec, IMAGE)
    return rev, m.worker_deployment(OWNER, spec, rev, IMAGE)


def pod_parts(deployment: dict) -> tuple[dict[str, str], dict[str, str], dict[str, dict]]:
    """(env, mounts by name -> path, volumes by name) of the worker container."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {v["name"]: v["mountPath"] for v in container["volumeMounts"]}
    return env, mounts, {v["name"]: v for v in pod["volumes"]}


def test_by_default_the_kernels_stay_in_the_pods_tmp():
    rev, deployment = worker(None)
    env, mounts, volumes = pod_parts(deployment)
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"].startswith(mounts["tmp"] + "/")
    assert env["TRITON_CACHE_DIR"].startswith(mounts["tmp"] + "/")
    assert "kernel-cache" not in volumes
    assert rev == worker("")[0]  # an empty claim is the default: the revision keeps its hash


def test_a_claim_is_mounted_and_the_caches_point_into_it():
    rev, deployment = worker("kembed-kernels")
    env, mounts, volumes = pod_parts(deployment)
    assert volumes["kernel-cache"] == {
        "name": "kernel-cache",
        "persistentVolumeClaim": {"claimName": "kembed-kernels"},
    }
    root = mounts["kernel-cache"]
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == f"{root}/flash-attn4"
    assert env["TRITON_CACHE_DIR"] == f"{root}/triton"
    assert rev != worker(None)[0]  # the pod template changes: a new revision, through the gates
    kubernetes_validate.validate(deployment, "1.31", strict=True)


@pytest.mark.parametrize("claim", ["Kernels", "-kernels", "a" * 254], ids=["upper", "dash-first", "too-long"])
def test_a_bad_claim_name_is_refused(claim):
    with pytest.raises(pydantic.ValidationError):
        worker(claim)
