"""Why a fetch of a Hub or S3 source failed, read from what Kubernetes kept of it: the JSON report
`kembed-worker fetch-model` writes as its termination message (a resolve Job's pod, a cache Job's pod,
a pod's fetch init container), or, where the command was ended before it could write one (a Job
past its activeDeadlineSeconds), what the Job says. model_resolve.py turns these into the
ModelFetchFailed condition and the metric."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from kembed.operator.build import model_fetch as mf
from kembed.operator.build import naming as n
from kembed.operator.build.naming import Owner

CONDITION = "ModelFetchFailed"
REASONS = {  # the command's reason word -> the condition's reason
    "forbidden": "Forbidden",
    "not_found": "NotFound",
    "checksum": "ChecksumMismatch",
    "disk_full": "DiskFull",
    "refused": "Refused",
    "unverified": "Unverified",
    "changed": "SourceChanged",
    "network": "Unreachable",
    "deadline": "DeadlineExceeded",
}


class Pods(Protocol):  # the part of apply.Cluster read here
    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class FetchFailure:
    uid: str  # the failed Job's, or the pod's and its restart count: the metric counts each once
    source: str
    reason: str  # the command's word (forbidden, not_found, checksum, ...)
    object: str
    message: str
    where: str  # "resolve Job x", "pod y"

    def text(self) -> str:
        what = f" {self.object}:" if self.object else ""
        return f"{self.source}{what} {self.message} ({self.where})"[:2000]


def job_conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        c.get("type", ""): c for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"
    }


def report_of(message: str) -> dict[str, Any]:
    """The command's JSON report, or (a log tail: it died before writing one) the tail as a message."""
    try:
        report = json.loads(message)
        if isinstance(report, dict):
            return report
    except ValueError:
        pass
    return {"ok": False, "reason": "other", "message": message.strip()[-1500:]}


def job_report(cluster: Pods, owner: Owner, job: dict[str, Any]) -> dict[str, Any] | None:
    """The report of the Job's latest pod that wrote one."""
    labels = {n.MODEL_LABEL: owner.name, n.COMPONENT_LABEL: job["metadata"]["labels"][n.COMPONENT_LABEL]}
    labels |= {
        k: v for k, v in job["metadata"]["labels"].items() if k in (mf.SOURCE_KEY_LABEL, n.REVISION_LABEL)
    }
    pods = sorted(
        cluster.list("Pod", owner.namespace, labels), key=lambda p: p["metadata"].get("creationTimestamp", "")
    )
    for pod in reversed(pods):
        for status in pod.get("status", {}).get("containerStatuses", []):
            message = status.get("state", {}).get("terminated", {}).get("message", "")
            if message.strip():
                return report_of(message)
    return None


def failure_of(
    report: dict[str, Any] | None, uid: str, source: str, where: str, fallback: str
) -> FetchFailure:
    report = report or {"reason": "other", "message": fallback}
    return FetchFailure(
        uid,
        str(report.get("source") or source),
        str(report.get("reason") or "other"),
        str(report.get("object") or ""),
        str(report.get("message") or fallback),
        where,
    )


def job_failure(cluster: Pods, owner: Owner, job: dict[str, Any], source: str) -> FetchFailure:
    """A Failed Job's failure: its last report, unless the Job ran out of time, which ends a pod
    without a report of this run (a report there is an earlier attempt's)."""
    name = job["metadata"]["name"]
    failed = job_conditions(job)["Failed"]
    report = job_report(cluster, owner, job)
    if failed.get("reason") == "DeadlineExceeded":
        deadline = job.get("spec", {}).get("activeDeadlineSeconds")
        report = {
            "reason": "deadline",
            "message": f"the Job ran past its deadline ({deadline} s, activeDeadlineSeconds)"
            + (f"; its last report: {report.get('message', '')}" if report and not report.get("ok") else ""),
        }
    return failure_of(
        report, job["metadata"].get("uid", name), source, f"Job {name}", failed.get("message", "")
    )


def pod_failures(cluster: Pods, owner: Owner, source: str) -> list[FetchFailure]:
    """Pods of the model whose fetch init container exited non-zero (now, or before its back-off)."""
    failures = []
    for pod in cluster.list("Pod", owner.namespace, {n.MODEL_LABEL: owner.name}):
        for status in pod.get("status", {}).get("initContainerStatuses", []):
            if status.get("name") != mf.INIT_CONTAINER:
                continue
            terminated = status.get("state", {}).get("terminated")
            if terminated is None and "waiting" in status.get("state", {}):
                terminated = status.get("lastState", {}).get("terminated")
            if terminated and terminated.get("exitCode", 0) != 0:
                name = pod["metadata"]["name"]
                uid = f"{pod['metadata'].get('uid', name)}/{status.get('restartCount', 0)}"
                report = report_of(terminated.get("message", "")) if terminated.get("message") else None
                failures.append(
                    failure_of(report, uid, source, f"pod {name}", f"exit code {terminated.get('exitCode')}")
                )
    return failures
