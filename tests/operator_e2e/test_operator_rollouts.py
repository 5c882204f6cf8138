"""The real operator against the API stand-in, with real workers, gateway and Job processes.

Scenarios of issue 4, in order: apply the example → Ready and answering; a spec change rolls out
through prewarm and smoke and retires the old revision; a candidate whose smoke test fails is
blocked while the old revision keeps answering; an operator killed mid-rollout resumes it; deleting
the model removes everything it owns.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from client_load import posting_to_gateway_pods
from operator_cluster import (
    CORRUPT_MODEL_DIR,
    EXAMPLE,
    MODEL_NAME,
    MODELS,
    condition,
    gateway_url,
    is_ready,
    patch_spec,
    start_ready,
)

pytestmark = pytest.mark.slow


def embed(url: str, text: str = "hello kubernetes") -> list[float]:
    answer = httpx.post(f"{url}/v1/embeddings", json={"model": MODEL_NAME, "input": text}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["data"][0]["embedding"]


def worker_ips(cluster, revision: str) -> set[str]:
    return {p.ip for p in cluster.kubelet.pods_of(f"minilm-worker-{revision}")}


def test_example_becomes_ready_and_answers(cluster, kubectl):
    started = time.monotonic()
    applied = cluster.kubectl(kubectl, "apply", "--server-side", "--validate=false", "-f", str(EXAMPLE))
    assert "serverside-applied" in applied
    cluster.wait("phase Ready", lambda: is_ready(cluster), timeout_s=120)
    status = cluster.model()["status"]
    revision = status["activeRevision"]
    runs = cluster.kubelet.jobs
    assert runs[f"minilm-prewarm-{revision}-1"].outcome == "Complete"
    assert runs[f"minilm-smoke-{revision}-1"].outcome == "Complete"
    assert status["readyReplicas"] == 1
    url = gateway_url(cluster)
    info = httpx.get(f"{url}/info", timeout=5).json()
    assert {w["address"].split(":")[0] for w in info["workers"]} == worker_ips(cluster, revision)
    assert len(embed(url)) == 384
    assert {"RolloutStarted", "Prewarmed", "SmokeTestPassed", "Promoted"} <= {r for _, r in cluster.events()}
    assert "minilm" in cluster.kubectl(kubectl, "get", "embeddingmodels", "-o", "name")
    print(f"ready and answering after {time.monotonic() - started:.1f} s")


def serves(cluster, revision: str) -> bool:
    status = (cluster.model() or {}).get("status") or {}
    return status.get("activeRevision") == revision and is_ready(cluster)


def new_candidate(cluster, old: str) -> str:
    return cluster.wait(
        "a new candidate revision",
        lambda: ((cluster.model().get("status") or {}).get("candidateRevision") or "").replace(old, ""),
        timeout_s=30,
    )


def names(cluster, prefix: str, plural: str) -> set[str]:
    return {o["metadata"]["name"] for o in cluster.items(prefix, plural)}


def test_spec_change_rolls_out_through_prewarm_and_smoke(cluster, example):
    old = start_ready(cluster, example)
    (old_ip,) = worker_ips(cluster, old)
    embed(gateway_url(cluster))  # traffic on the old revision: its hot buckets are what prewarm reads
    started = time.monotonic()
    patch_spec(cluster, {"worker": {"maxBatchSequences": 64}})
    new = new_candidate(cluster, old)
    cluster.wait(f"revision {new} serving", lambda: serves(cluster, new), timeout_s=120)
    runs = cluster.kubelet.jobs
    assert runs[f"minilm-prewarm-{new}-1"].outcome == "Complete"
    assert f"{old_ip}:50051" in runs[f"minilm-prewarm-{new}-1"].command  # --hot-from the serving pod
    assert runs[f"minilm-smoke-{new}-1"].outcome == "Complete"
    # The golden Job ran the gateway's tokenizer on both revisions; the first kept the record of the
    # bundled weights (read from its pod's log), the second answered the same.
    assert runs[f"minilm-golden-{new}-1"].outcome == "Complete"
    (record,) = [c for c in cluster.items("/api/v1", "configmaps") if "-golden-" in c["metadata"]["name"]]
    assert record["metadata"]["annotations"]["kembed.dev/recorded-from"] == old
    passed = [e["message"] for e in cluster.items("/api/v1", "events") if e["reason"] == "SmokeTestPassed"]
    assert any(new in m and "golden texts match their record" in m for m in passed), passed
    cluster.wait(
        f"revision {old} retired",
        lambda: (
            names(cluster, "/apis/apps/v1", "deployments") == {"minilm-gateway", f"minilm-worker-{new}"}
            and not cluster.kubelet.pods_of(f"minilm-worker-{old}")
        ),
        timeout_s=30,
    )
    assert f"minilm-engine-{old}" not in names(cluster, "/api/v1", "configmaps")
    assert f"minilm-worker-{old}" not in names(cluster, "/api/v1", "services")
    url = gateway_url(cluster)
    info = httpx.get(f"{url}/info", timeout=5).json()
    assert {w["address"].split(":")[0] for w in info["workers"]} == worker_ips(cluster, new)
    assert len(embed(url)) == 384
    print(f"rolled out {old} -> {new} in {time.monotonic() - started:.1f} s")


def test_failed_smoke_test_blocks_and_old_revision_keeps_serving(cluster, example):
    old = start_ready(cluster, example)
    url = gateway_url(cluster)
    before = embed(url)
    started = time.monotonic()
    patch_spec(cluster, {"model": {"source": {"hostPath": {"path": CORRUPT_MODEL_DIR}}}})
    new = new_candidate(cluster, old)
    blocked = cluster.wait(
        "RolloutBlocked",
        lambda: condition(cluster.model(), "RolloutBlocked").get("status") == "True",
        timeout_s=120,
    )
    assert blocked
    model = cluster.model()
    reason = condition(model, "RolloutBlocked")
    assert reason["reason"] == "SmokeTestFailed", reason
    assert "NaN" in reason["message"] or "FAIL" in reason["message"].upper(), reason["message"]
    assert model["status"]["phase"] == "Blocked"
    assert model["status"]["activeRevision"] == old
    assert cluster.kubelet.jobs[f"minilm-smoke-{new}-1"].outcome == "Failed"
    assert ("Warning", "RolloutBlocked") in cluster.events()
    # The candidate's workers go (they hold GPUs); the old revision and the gateway stay as they were.
    cluster.wait(
        "candidate workers removed",
        lambda: not cluster.kubelet.pods_of(f"minilm-worker-{new}"),
        timeout_s=30,
    )
    assert gateway_url(cluster) == url
    assert embed(url) == pytest.approx(before, abs=1e-5)
    print(f"blocked {new} in {time.monotonic() - started:.1f} s: {reason['message'][:200]!r}")


def test_operator_killed_mid_rollout_resumes_it(cluster, example):
    old = start_ready(cluster, example)
    started = time.monotonic()
    cluster.kubelet.is_holding_jobs.set()  # the prewarm Job pends: the rollout waits in Prewarming
    patch_spec(cluster, {"worker": {"maxBatchSequences": 64}})
    new = new_candidate(cluster, old)
    cluster.wait("stage Prewarming", lambda: rollout_stage(cluster) == "Prewarming", timeout_s=60)
    cluster.kill_operator()
    status = cluster.model()["status"]
    assert (status["activeRevision"], status["rollout"]["stage"]) == (old, "Prewarming")
    cluster.start_operator()
    cluster.kubelet.is_holding_jobs.clear()
    cluster.wait(f"revision {new} serving", lambda: serves(cluster, new), timeout_s=120)
    runs = cluster.kubelet.jobs
    assert runs[f"minilm-prewarm-{new}-1"].outcome == "Complete"  # the same Job, found again
    assert f"minilm-prewarm-{new}-2" not in runs
    assert len(embed(gateway_url(cluster))) == 384
    print(f"killed in Prewarming; {new} served {time.monotonic() - started:.1f} s after the change")


def rollout_stage(cluster) -> str:
    return (((cluster.model() or {}).get("status") or {}).get("rollout") or {}).get("stage", "")


def test_delete_removes_everything_owned(cluster, example):
    revision = start_ready(cluster, example)
    guards = {  # made by the operator beside the Deployments (policies.py)
        ("/apis/policy/v1", "poddisruptionbudgets"): ["minilm-gateway", f"minilm-worker-{revision}"],
        ("/apis/networking.k8s.io/v1", "networkpolicies"): ["minilm-gateway", "minilm-worker"],
    }
    for kind, expected in guards.items():
        assert sorted(o["metadata"]["name"] for o in cluster.items(*kind)) == expected
    assert 'model_phase{model="minilm",model_namespace="default",phase="Ready"} 1.0' in operator_metrics(
        cluster
    )
    started = time.monotonic()
    cluster.api.delete(f"{MODELS}/minilm").raise_for_status()
    kinds = [
        ("/apis/apps/v1", "deployments"),
        ("/apis/batch/v1", "jobs"),
        ("/api/v1", "services"),
        ("/api/v1", "configmaps"),
        ("/api/v1", "pods"),
        ("/apis/policy/v1", "poddisruptionbudgets"),
        ("/apis/networking.k8s.io/v1", "networkpolicies"),
    ]
    cluster.wait(
        "every owned object gone",
        lambda: not any(cluster.items(*kind) for kind in kinds),
        timeout_s=30,
    )
    cluster.wait(
        "every process stopped",
        lambda: (
            not cluster.kubelet.pods_of(f"minilm-worker-{revision}")
            and not cluster.kubelet.pods_of("minilm-gateway")
        ),
        timeout_s=30,
    )
    print(f"deleted in {time.monotonic() - started:.1f} s")
    # the watch's DELETED event took the model's phase series with it
    assert 'model="minilm"' not in operator_metrics(cluster)


def operator_metrics(cluster) -> str:
    return httpx.get(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10).text


def gateway_rolled_to(cluster, revision: str) -> bool:
    """The gateway Deployment's template points at `revision` and every pod runs it, available."""
    (gateway,) = [
        d for d in cluster.items("/apis/apps/v1", "deployments") if d["metadata"]["name"] == "minilm-gateway"
    ]
    status, want = gateway.get("status", {}), gateway["spec"].get("replicas", 1)
    on = gateway["spec"]["template"]["metadata"].get("annotations", {}).get("kembed.dev/revision") == revision
    return (
        on
        and status.get("updatedReplicas") == status.get("replicas") == status.get("availableReplicas") == want
    )


def test_a_change_while_the_gateway_switches_keeps_every_request_answered(cluster, example):
    """The reproduction of a total outage: revision B passes its gates, the gateway rolls onto B, and
    before the operator records it a change C arrives, one that will block (NaN weights). B's workers
    must stay while the gateway points at them: B is promoted, C is gated from it and blocks, and B
    serves on. The operator is paused (SIGSTOP) for the window, so the timing is the worst case every
    time. A client posts to the gateway's ready pods all along, until well after B's old pods would
    have drained away: every answer is a 200."""
    old = start_ready(cluster, example)
    with posting_to_gateway_pods(cluster, {"input": "hello"}) as answers:
        patch_spec(cluster, {"worker": {"maxBatchSequences": 64}})
        b = new_candidate(cluster, old)
        cluster.wait(
            "B promoting",
            lambda: ((cluster.model()["status"].get("rollout") or {}).get("stage")) == "Promoting",
            timeout_s=120,
        )
        os.kill(cluster.operator.pid, signal.SIGSTOP)
        try:
            cluster.wait(f"the gateway rolled onto {b}", lambda: gateway_rolled_to(cluster, b), timeout_s=60)
            patch_spec(cluster, {"model": {"source": {"hostPath": {"path": CORRUPT_MODEL_DIR}}}})
        finally:
            os.kill(cluster.operator.pid, signal.SIGCONT)
        cluster.wait(
            "the change blocked",
            lambda: condition(cluster.model(), "RolloutBlocked").get("status") == "True",
            timeout_s=120,
        )
        time.sleep(15)  # past a retired pod's preStop and drain: had B gone, the gateway would have nothing
    assert answers and set(answers) == {200}, (
        f"{len(answers)} answers, not 200: {sorted(set(answers) - {200})}"
    )
    status = cluster.model()["status"]
    assert status["activeRevision"] == b and condition(cluster.model(), "Ready")["status"] == "True"
    promoted = [e["message"] for e in cluster.items("/api/v1", "events") if e["reason"] == "Promoted"]
    assert any(f"revision {b} serves" in m for m in promoted), promoted
    assert gateway_rolled_to(cluster, b) and worker_ips(cluster, b)
    print(f"{len(answers)} answers, all 200: {old} -> {b} promoted, then the change blocked")


def test_rolling_back_to_a_retired_revision_runs_its_jobs_again(cluster, example):
    """A spec changed back after its revision retired asks that revision's Jobs again, under the
    names they had (revision and attempt 1), which the stand-in's kubelet runs as the new Jobs they
    are; the revision serves again. Before, the kubelet held the first run's outcome by name, never
    ran the Jobs created again, and the rollback hung in Prewarming."""
    old = start_ready(cluster, example)
    before = cluster.model()["spec"]["worker"].get("maxBatchSequences")
    patch_spec(cluster, {"worker": {"maxBatchSequences": 64}})
    new = new_candidate(cluster, old)
    cluster.wait(f"revision {new} serving", lambda: serves(cluster, new), timeout_s=120)
    cluster.wait(
        f"revision {old} retired, its Jobs gone",
        lambda: (
            not any(old in name for name in names(cluster, "/apis/batch/v1", "jobs"))
            and not cluster.kubelet.pods_of(f"minilm-worker-{old}")
        ),
        timeout_s=30,
    )
    patch_spec(cluster, {"worker": {"maxBatchSequences": before}})  # back: the retired revision
    cluster.wait(f"revision {old} serving again", lambda: serves(cluster, old), timeout_s=120)
    prewarms = [run for run in cluster.kubelet.job_runs if run.name == f"minilm-prewarm-{old}-1"]
    assert [run.outcome for run in prewarms] == ["Complete", "Complete"], prewarms
    assert len({run.uid for run in prewarms}) == 2
    assert cluster.kubelet.jobs[f"minilm-smoke-{old}-1"].outcome == "Complete"
    assert len(embed(gateway_url(cluster))) == 384
