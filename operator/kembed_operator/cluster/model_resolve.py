"""A fetched model source as the operator sees it: what it resolved to, whether a revision's cache is
filled, and why a fetch failed. Builds nothing (model_fetch.py does); reads and deletes Jobs and reads
pods through `apply.Cluster`.

- **Resolution**: `status.model` keeps what the source resolved to and for which source (a hash of it)
  and refresh interval. A new source or interval gets a resolve Job; its pod's termination message
  is the answer (the commit sha or the objects' digest, and for S3 a pin: their VersionIds or
  ETags), recorded, and the Job deleted. While a changed source is resolved (seconds), or cannot be,
  `reconcile` leaves the model's objects as they are; a refresh of the same source keeps serving
  what was resolved before. A failed resolve is retried a minute later (a Secret fixed, access
  granted).
- **Pinned**: every pod and cache Job of a revision fetches what that revision was made from
  (`status.model.revisions`) with its pin (`status.model.pins`), never the source as it is now, so a
  pod restarted after an upstream push serves what passed the gates. A resolution met again by a
  refresh keeps the pin it had: the pods' spec does not change for an unchanged source.
- **Failures**: a resolve Job, a cache Job or a pod's fetch init container that exited non-zero is a
  `ModelFetchFailed` condition naming the source, the object and the error (model_failures.py
  reads them), within a drift-timer period (10 s) of the exit, and a count by reason in the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from kembed.operator.build import model_fetch as mf
from kembed.operator.build import naming as n
from kembed.operator.build.naming import Owner
from kembed.operator.cluster.model_failures import (
    CONDITION,
    REASONS,
    job_conditions,
    job_failure,
    job_report,
    pod_failures,
)
from kembed.operator.cluster.model_failures import FetchFailure as FetchFailure  # reconcile's type
from kembed.operator.spec.model_spec import ModelStatus
from kembed.operator.spec.spec import EmbeddingModelSpec

RETRY_FAILED_RESOLVE_S = 60


class Cluster(Protocol):  # the part of apply.Cluster used here
    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]: ...
    def create(self, body: dict[str, Any]) -> None: ...
    def delete(self, kind: str, namespace: str, name: str) -> None: ...


@dataclass(frozen=True)
class FetchState:
    """The fetched source this pass: nothing of it for a mounted source (status None)."""

    status: ModelStatus | None = None
    resolved: str = ""
    is_pending: bool = False  # a changed source not resolved yet: leave the objects alone
    failures: list[FetchFailure] = field(default_factory=list)


def resolve(
    cluster: Cluster,
    owner: Owner,
    spec: EmbeddingModelSpec,
    raw_status: dict[str, Any] | None,
    now: datetime,
    image: str,
) -> FetchState:
    """What the fetched source resolves to, resolving it (a Job) when the source or its interval is new."""
    if spec.model.source.fetched is None:
        return FetchState()
    previous = _previous(raw_status)
    uri, source_hash = mf.source_uri(spec.model), mf.source_hash(spec.model)
    key = mf.source_key(spec.model, mf.refresh_epoch(spec.model, now.timestamp()))
    usable = (
        previous
        if previous is not None and previous.source_hash == source_hash and previous.resolved
        else None
    )
    jobs = cluster.list("Job", owner.namespace, {n.MODEL_LABEL: owner.name, n.COMPONENT_LABEL: mf.RESOLVE})
    for earlier in jobs:  # those of an earlier source or interval
        if earlier["metadata"]["labels"].get(mf.SOURCE_KEY_LABEL) != key:
            cluster.delete("Job", owner.namespace, earlier["metadata"]["name"])
    if usable is not None and usable.source_key == key:
        return FetchState(usable, usable.resolved)
    base = usable or ModelStatus(source=uri, source_hash=source_hash)
    state = FetchState(base, usable.resolved if usable else "", is_pending=usable is None)
    job: dict[str, Any] | None = next(
        (j for j in jobs if j["metadata"]["labels"].get(mf.SOURCE_KEY_LABEL) == key), None
    )
    if job is None:
        cluster.create(mf.resolve_job(owner, spec, key, image))
        return state
    finished = job_conditions(job)
    name = job["metadata"]["name"]
    if "Complete" in finished:
        report = job_report(cluster, owner, job)
        cluster.delete("Job", owner.namespace, name)  # its answer is recorded below; if none, once more
        if report is None or not report.get("ok") or not report.get("resolved"):
            return state
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        answer = str(report["resolved"])
        pins = dict(usable.pins) if usable else {}
        if report.get("pin"):  # a resolution met again keeps its pin: its pods' spec stays as it is
            pins.setdefault(answer, str(report["pin"]))
        resolved = ModelStatus(
            source=uri,
            source_hash=source_hash,
            source_key=key,
            resolved=answer,
            resolved_at=stamp,
            revisions=usable.revisions if usable else {},
            pins=pins,
            serving=usable.serving if usable else "",
        )
        return FetchState(resolved, resolved.resolved)
    if "Failed" in finished:
        failed = finished["Failed"]
        failure = job_failure(cluster, owner, job, uri)
        ended = failed.get("lastTransitionTime")
        if (
            ended
            and (now - datetime.fromisoformat(ended.replace("Z", "+00:00"))).total_seconds()
            > RETRY_FAILED_RESOLVE_S
        ):
            cluster.delete("Job", owner.namespace, name)  # tried again on the next pass
        return FetchState(state.status, state.resolved, state.is_pending, [failure])
    return state


def _previous(raw_status: dict[str, Any] | None) -> ModelStatus | None:
    raw = (raw_status or {}).get("model")
    try:
        return ModelStatus.model_validate(raw) if raw else None
    except ValueError:
        return None


# --- a revision's fetch -------------------------------------------------------------------------


def resolved_for(state: FetchState, revision: str, current_revision: str) -> str:
    """What `revision` was made from: the current resolution for the current revision, else the one
    recorded for it (a gateway still on the serving revision fetches what that revision serves)."""
    if revision == current_revision or state.status is None:
        return state.resolved
    return state.status.revisions.get(revision, state.resolved)


def pin_for(state: FetchState, resolved: str) -> str:
    """What a fetch of `resolved` asks for besides it (S3: the objects' versions or ETags)."""
    return state.status.pins.get(resolved, "") if state.status is not None else ""


def cache_ready(
    cluster: Cluster,
    owner: Owner,
    spec: EmbeddingModelSpec,
    revision: str,
    resolved: str,
    image: str,
    pin: str = "",
) -> tuple[bool, list[FetchFailure]]:
    """Whether `revision`'s cache Job has filled the claim (creating the Job when missing)."""
    name = mf.cache_job_name(owner, revision)
    job = cluster.get("Job", owner.namespace, name)
    if job is None:
        cluster.create(mf.cache_job(owner, spec, revision, resolved, image, pin))
        return False, []
    finished = job_conditions(job)
    if "Failed" in finished:
        return False, [job_failure(cluster, owner, job, mf.source_uri(spec.model))]
    return "Complete" in finished, []


def prune_cache_jobs(cluster: Cluster, owner: Owner, kept: frozenset[str] | set[str]) -> None:
    for job in cluster.list("Job", owner.namespace, {n.MODEL_LABEL: owner.name, n.COMPONENT_LABEL: mf.CACHE}):
        if job["metadata"]["labels"].get(n.REVISION_LABEL) not in kept:
            cluster.delete("Job", owner.namespace, job["metadata"]["name"])


# --- status -------------------------------------------------------------------------------------


def with_model_status(
    body: dict[str, Any],
    state: FetchState,
    revision: str,
    kept: frozenset[str] | set[str],
    active: str,
    generation: int,
    now: datetime,
) -> dict[str, Any]:
    """`body` (a status) with `model` (what each kept revision was made from, what is served) and the
    ModelFetchFailed condition set, or both gone for a mounted source."""
    body = dict(body)
    if state.status is None:
        if "model" in (body or {}):
            body["model"] = None
        body["conditions"] = [c for c in body.get("conditions", []) if c.get("type") != CONDITION]
        return body
    model = state.status
    if state.resolved and not state.is_pending:
        revisions = {r: v for r, v in model.revisions.items() if r in kept} | {revision: state.resolved}
        pins = {r: v for r, v in model.pins.items() if r in revisions.values()}
        model = model.model_copy(
            update={
                "revision": revision,
                "revisions": revisions,
                "pins": pins,
                "serving": revisions.get(active, ""),
            }
        )
    body["model"] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return with_condition(body, state.failures, generation, now)


def with_condition(
    body: dict[str, Any], failures: list[FetchFailure], generation: int, now: datetime
) -> dict[str, Any]:
    conditions = [c for c in body.get("conditions", []) if c.get("type") != CONDITION]
    old = next((c for c in body.get("conditions", []) if c.get("type") == CONDITION), None)
    status = "True" if failures else "False"
    first = failures[0] if failures else None
    condition = {
        "type": CONDITION,
        "status": status,
        "reason": REASONS.get(first.reason, "FetchFailed") if first else "Fetched",
        "message": first.text() if first else "",
        "lastTransitionTime": old["lastTransitionTime"]
        if old is not None and old.get("status") == status
        else now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "observedGeneration": generation,
    }
    return {**body, "conditions": sorted([*conditions, condition], key=lambda c: c["type"])}


def pending_status(
    raw_status: dict[str, Any] | None, state: FetchState, generation: int, now: datetime
) -> dict[str, Any]:
    """The status while a changed source resolves: as it was, with `model` and the condition; a new
    model reads Pending, not Ready, saying why."""
    body = dict(raw_status or {})
    assert state.status is not None
    body["model"] = state.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    had_failed = any(
        c.get("type") == CONDITION and c.get("status") == "True" for c in body.get("conditions", [])
    )
    if state.failures or not had_failed:  # a failure stays said while it is retried
        body = with_condition(body, state.failures, generation, now)
    body.setdefault("phase", "Pending")
    old = next((c for c in body["conditions"] if c.get("type") == "Ready"), None)
    if (old is None or old.get("reason") in ("ResolvingModel", "ModelFetchFailed")) and (
        state.failures or not had_failed
    ):  # not served yet: Ready says why
        first = state.failures[0] if state.failures else None
        ready = {
            "type": "Ready",
            "status": "False",
            "reason": "ModelFetchFailed" if first else "ResolvingModel",
            "message": first.text() if first else f"resolving {state.status.source}",
            "lastTransitionTime": old["lastTransitionTime"] if old else now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "observedGeneration": generation,
        }
        others = [c for c in body["conditions"] if c.get("type") != "Ready"]
        body["conditions"] = sorted([*others, ready], key=lambda c: c["type"])
    return body


# --- what reconcile carries out -----------------------------------------------------------------


@dataclass(frozen=True)
class ModelFetch:
    """This pass's fetched source, for `carry_out`: which revisions' pods may be created (their cache
    filled) and how a pod's model volume is made (`fill`). A mounted source changes nothing."""

    spec: EmbeddingModelSpec | None = None
    state: FetchState = field(default_factory=FetchState)
    revision: str = ""  # the current spec's
    cached: frozenset[str] = frozenset()  # revisions whose cache Job is Complete (with spec.model.cache)

    def is_ready(self, revision: str) -> bool:
        if self.spec is None or self.spec.model.source.fetched is None or self.spec.model.cache is None:
            return True
        return revision in self.cached

    def fill(self, body: dict[str, Any], revision: str, *, skip_weights: bool = False) -> dict[str, Any]:
        if self.spec is None:
            return body
        resolved = resolved_for(self.state, revision, self.revision)
        pin = pin_for(self.state, resolved)
        return mf.with_fetch(body, self.spec, resolved, pin=pin, skip_weights=skip_weights)


def prepare(
    cluster: Cluster,
    owner: Owner,
    spec: EmbeddingModelSpec,
    state: FetchState,
    revision: str,
    kept: frozenset[str] | set[str],
    image: str,
) -> tuple[ModelFetch, list[FetchFailure]]:
    """The cache Jobs of the kept revisions (made, read, the others deleted) and the pods' failures."""
    if spec.model.source.fetched is None:
        return ModelFetch(), []
    failures = list(state.failures)
    cached = set()
    if spec.model.cache is not None:
        for kept_revision in sorted({*kept, revision}):
            resolved = resolved_for(state, kept_revision, revision)
            pin = pin_for(state, resolved)
            is_ready, failed = cache_ready(cluster, owner, spec, kept_revision, resolved, image, pin)
            failures += failed
            if is_ready:
                cached.add(kept_revision)
        prune_cache_jobs(cluster, owner, {*kept, revision})
    failures += pod_failures(cluster, owner, mf.source_uri(spec.model))
    return ModelFetch(spec, state, revision, frozenset(cached)), failures


NO_FETCH = ModelFetch()
