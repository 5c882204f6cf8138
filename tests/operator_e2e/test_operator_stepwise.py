"""A stepwise rollout (rollout.maxSurgeReplicas) with the real operator, real workers, gateway and Job
processes: two serving pods, one spare. The canary passes its gate, the gateway serves from both
revisions' pods, a pod moves over, and the new revision is promoted; a client posting all along gets
a 200 every time, and never more than three worker pods run."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from operator_cluster import patch_spec, start_ready

pytestmark = pytest.mark.slow


def test_a_stepwise_rollout_holds_one_spare_pod_and_fails_no_request(cluster, example):
    example["spec"]["worker"]["replicas"] = 2
    example["spec"].setdefault("rollout", {})["maxSurgeReplicas"] = 1
    old = start_ready(cluster, example)
    answers: list[int] = []
    most_pods = 0
    done = threading.Event()

    def worker_pods() -> int:
        status = cluster.model()["status"]
        revisions = {old, status.get("candidateRevision") or "", status.get("activeRevision") or ""} - {""}
        return sum(len(cluster.kubelet.pods_of(f"minilm-worker-{r}")) for r in revisions)

    def client() -> None:
        nonlocal most_pods
        while not done.is_set():
            most_pods = max(most_pods, worker_pods())
            pods = [p for p in cluster.kubelet.pods_of("minilm-gateway") if p.is_ready]
            try:
                answer = httpx.post(
                    f"http://{pods[-1].ip}:8080/v1/embeddings", json={"input": ["a", "b c"]}, timeout=10
                )
            except (httpx.HTTPError, IndexError):  # a pod going away as it was picked: a Service moves on
                continue
            answers.append(answer.status_code)
            time.sleep(0.05)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        patch_spec(cluster, {"worker": {"maxBatchSequences": 64}})  # an engine setting: the same weights
        cluster.wait(
            "the new revision serving",
            lambda: (
                (s := cluster.model()["status"]).get("activeRevision") not in (None, old)
                and s.get("phase") == "Ready"
            ),
            timeout_s=240,
        )
        time.sleep(3)  # past the old revision's retirement
    finally:
        done.set()
        thread.join(30)
    assert answers and set(answers) == {200}, f"{len(answers)} answers: {sorted(set(answers) - {200})}"
    assert most_pods <= 3, most_pods
    reasons = [e["reason"] for e in cluster.items("/api/v1", "events")]
    assert "Mixing" in reasons and reasons.count("SteppedUp") == 1 and "Promoted" in reasons, reasons
    print(f"{len(answers)} answers, all 200; at most {most_pods} worker pods")
