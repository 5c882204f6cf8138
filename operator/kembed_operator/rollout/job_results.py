"""The rollout Jobs' outcomes as read from the cluster: each Job's state by (kind, revision,
attempt), a failed one's report (its pod's termination message), and a succeeded golden Job turned
into its verdict (golden.py) from its pod's log."""

from __future__ import annotations

from typing import Any, Protocol

from kembed.operator.build import naming as n
from kembed.operator.build.naming import Owner
from kembed.operator.rollout import golden as g
from kembed.operator.rollout.gate import JOB_KINDS
from kembed.operator.rollout.golden import GoldenRecord
from kembed.operator.rollout.world import JobKey, JobState
from kembed.operator.spec.spec import EmbeddingModelSpec


class Cluster(Protocol):  # the part of apply.Cluster used here
    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]: ...
    def pod_log(self, namespace: str, name: str, container: str) -> str | None: ...


def _failure_message(cluster: Cluster, owner: Owner, job: dict[str, Any]) -> str:
    condition: dict[str, Any] = next(
        (c for c in job.get("status", {}).get("conditions", []) if c.get("type") == "Failed"), {}
    )
    parts = [f"{condition.get('reason', 'Failed')}: {condition.get('message', '')}".strip()]
    for pod in _job_pods(cluster, owner, job):
        for status in pod.get("status", {}).get("containerStatuses", []):
            report = status.get("state", {}).get("terminated", {}).get("message", "").strip()
            if report:
                parts.append(report[-1500:])  # a condition message should stay readable
                break
    return "\n".join(parts)


def read_jobs(
    cluster: Cluster, owner: Owner
) -> tuple[dict[tuple[str, str, int], JobState], list[dict[str, Any]]]:
    found: dict[tuple[str, str, int], JobState] = {}
    bodies: list[dict[str, Any]] = []
    for kind in JOB_KINDS:
        for job in cluster.list("Job", owner.namespace, n.selector(owner, kind)):
            key = job_key(job)
            conditions = {c.get("type"): c.get("status") for c in job.get("status", {}).get("conditions", [])}
            if conditions.get("Complete") == "True":
                found[key] = JobState("Succeeded")
            elif conditions.get("Failed") == "True":
                found[key] = JobState("Failed", _failure_message(cluster, owner, job))
            else:
                found[key] = JobState("Running")
            bodies.append(job)
    return found, bodies


def _job_pods(cluster: Cluster, owner: Owner, job: dict[str, Any]) -> list[dict[str, Any]]:
    labels = {k: v for k, v in job["metadata"]["labels"].items() if k.startswith("kembed.dev/")}
    labels[n.COMPONENT_LABEL] = job["metadata"]["labels"][n.COMPONENT_LABEL]
    return cluster.list("Pod", owner.namespace, labels)


def judge_golden(
    cluster: Cluster,
    owner: Owner,
    spec: EmbeddingModelSpec,
    states: dict[JobKey, JobState],
    bodies: list[dict[str, Any]],
) -> dict[JobKey, GoldenRecord]:
    """Turn each succeeded golden Job into its verdict (golden.py): its answer, read from its pod's
    log, against the record kept for the same weights. A mismatch, or a log without a record, fails
    it (the gate cannot vouch for the revision); one that passes may bring an answer to keep."""
    to_keep: dict[JobKey, GoldenRecord] = {}
    succeeded = [
        b
        for b in bodies
        if b["metadata"]["labels"][n.COMPONENT_LABEL] == "golden" and states[job_key(b)].phase == "Succeeded"
    ]
    if not succeeded:
        return to_keep
    kept = g.kept(cluster.list("ConfigMap", owner.namespace, n.selector(owner, "golden")))
    for job in succeeded:
        key = job_key(job)
        try:
            record = _read_record(cluster, owner, job)
        except g.UnreadableRecord as error:
            states[key] = JobState("Failed", f"{error} (may the operator read pods/log?)")
            continue
        verdict = g.judge(record, kept.get(record.weights_id), spec.rollout.golden, spec.rollout.min_cosine)
        states[key] = JobState("Succeeded" if verdict.passed else "Failed", verdict.message)
        if verdict.record is not None:
            to_keep[key] = verdict.record
    return to_keep


def _read_record(cluster: Cluster, owner: Owner, job: dict[str, Any]) -> GoldenRecord:
    for pod in _job_pods(cluster, owner, job):
        if pod.get("status", {}).get("phase") != "Succeeded":
            continue
        log = cluster.pod_log(owner.namespace, pod["metadata"]["name"], "golden")
        if log is not None:
            return g.from_log(log)
    raise g.UnreadableRecord(f"Job {job['metadata']['name']} succeeded, but no pod of it has a log")


def job_key(job: dict[str, Any]) -> JobKey:
    labels = job["metadata"]["labels"]
    return (
        labels[n.COMPONENT_LABEL],
        labels.get(n.REVISION_LABEL, ""),
        int(labels.get(n.ATTEMPT_LABEL, "0")),
    )
