"""A stepwise rollout (rollout.maxSurgeReplicas) with the real operator, real workers, gateway and Job
processes: two serving pods, one spare. The canary passes its gate, the gateway serves from both
revisions' pods, a pod moves over, and the new revision is promoted; a client posting all along gets
a 200 every time, and never more than three worker pods run."""

from __future__ import annotations

import time

import pytest
from client_load import posting_to_gateway_pods
from operator_cluster import patch_spec, start_ready

pytestmark = pytest.mark.slow


def test_a_stepwise_rollout_holds_one_spare_pod_and_fails_no_request(cluster, example):
    example["spec"]["worker"]["replicas"] = 2
    example["spec"].setdefault("rollout", {})["maxSurgeReplicas"] = 1
    old = start_ready(cluster, example)
    most_pods = 0

    def count_worker_pods() -> None:
        nonlocal most_pods
        status = cluster.model()["status"]
        revisions = {old, status.get("candidateRevision") or "", status.get("activeRevision") or ""} - {""}
        most_pods = max(most_pods, sum(len(cluster.kubelet.pods_of(f"minilm-worker-{r}")) for r in revisions))

    with posting_to_gateway_pods(cluster, {"input": ["a", "b c"]}, each=count_worker_pods) as answers:
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
    assert answers and set(answers) == {200}, f"{len(answers)} answers: {sorted(set(answers) - {200})}"
    assert most_pods <= 3, most_pods
    reasons = [e["reason"] for e in cluster.items("/api/v1", "events")]
    assert "Mixing" in reasons and reasons.count("SteppedUp") == 1 and "Promoted" in reasons, reasons
    print(f"{len(answers)} answers, all 200; at most {most_pods} worker pods")
