"""Images named by digest: `rollout.requireDigests` refuses a tag; without it the digest the gated pods
ran is kept, a candidate whose pods run different images blocks, and a serving pod that runs another
image than the gated one (its tag moved) pins the revision's Deployment to the gated digest."""

from __future__ import annotations

import pytest
from operator_fakes import Driver, example

from kembed.operator.build import images
from kembed.operator.cluster.reconcile import InvalidSpec

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


@pytest.mark.parametrize(
    ("reference", "pinned"),
    [
        ("registry:5000/team/worker:1.2", "registry:5000/team/worker@" + A),
        ("worker", "worker@" + A),
        ("ghcr.io/a/b@" + B, "ghcr.io/a/b@" + A),
        ("ghcr.io/a/b:1@" + B, "ghcr.io/a/b@" + A),
    ],
    ids=["port-and-tag", "bare-name", "digest", "tag-and-digest"],
)
def test_a_reference_is_pinned_to_a_digest(reference, pinned):
    assert images.by_digest(reference, A) == pinned
    assert images.is_by_digest(pinned) and not images.is_by_digest("registry:5000/team/worker:1.2")


def worker_image(driver: Driver, revision: str) -> str:
    (deployment,) = driver.cluster.named("Deployment", "worker", revision)
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"]


def test_require_digests_refuses_each_tag_by_name():
    spec = example("minilm-cpu.yaml")["spec"] | {"rollout": {"requireDigests": True}}
    with pytest.raises(InvalidSpec, match=r"worker image 'registry.test/kembed/worker:1', gateway image"):
        Driver(spec).step()
    digested = spec | {
        "worker": spec["worker"] | {"image": "registry.test/kembed/worker@" + A},
        "gateway": {"image": "registry.test/kembed/gateway@" + B},
    }
    assert Driver(digested).step()["rollout"]["stage"] == "Deploying"


def test_a_moved_tag_is_pinned_to_the_digest_that_passed_the_gate():
    driver = Driver(example("minilm-cpu.yaml")["spec"])
    revision = driver.step()["candidateRevision"]
    driver.cluster.run_workers(revision, image_ids=(f"registry.test/kembed/worker@{A}",))
    driver.step()
    driver.cluster.finish_job("prewarm", True)
    driver.step()
    driver.cluster.finish_job("smoke", True)
    driver.step()
    driver.cluster.roll_gateway()
    status = driver.step()
    assert status["activeImageDigest"] == A and not status.get("activeImagePinned")
    assert worker_image(driver, revision) == "registry.test/kembed/worker:1"

    driver.cluster.run_workers(revision, image_ids=(f"docker-pullable://registry.test/kembed/worker@{B}",))
    status = driver.step()  # a pod restarted on a node that pulled the moved tag
    assert status["activeImagePinned"] is True
    assert worker_image(driver, revision) == "registry.test/kembed/worker@" + A
    drift = [(type_, m) for type_, reason, m in driver.cluster.events if reason == "ImageDrift"]
    assert len(drift) == 1 and drift[0][0] == "Warning" and B in drift[0][1]
    driver.step()
    assert len([e for e in driver.cluster.events if e[1] == "ImageDrift"]) == 1  # said once
    assert worker_image(driver, revision) == "registry.test/kembed/worker@" + A  # and it stays

    driver.edit("worker", maxBatchTokens=1024)  # the next revision passes its own gate on its own image
    new = driver.promote()
    assert worker_image(driver, new) == "registry.test/kembed/worker:1"
    assert not driver.body["status"].get("activeImagePinned")


def test_candidate_pods_on_different_images_block():
    spec = example("minilm-cpu.yaml")["spec"]
    spec = spec | {"worker": spec["worker"] | {"replicas": 2}}
    driver = Driver(spec)
    revision = driver.step()["candidateRevision"]
    driver.cluster.run_workers(revision, image_ids=(f"w@{A}", f"w@{B}"))
    status = driver.step()
    assert status["phase"] == "Blocked"
    blocked = driver.condition("RolloutBlocked")
    assert blocked["reason"] == "ImageMismatch" and A in blocked["message"] and B in blocked["message"]
