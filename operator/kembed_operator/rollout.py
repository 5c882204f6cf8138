"""The rollout state machine, as one pure function: observed world + last status → plan + new status.

    Deploying ──candidate pods ready──▶ Prewarming ──Job ok──▶ SmokeTesting ──Job ok──▶ Promoting
        │ not ready in time              │ failed / timed out     │ failed / timed out     │ gateway
        ▼                                ▼                        ▼                        ▼ rolled
     Blocked ◀───────────────────────────┴────────────────────────┘                   serving R,
        │ metadata.generation moves on (a later spec change): attempt + 1, Deploying   old retired

The stage, attempt, stage start and prewarmed pod addresses live in `status.rollout`, so a restarted
operator resumes where it was; Job names carry revision and attempt, so it finds its Jobs again.
While blocked, the serving revision and the gateway are untouched and the candidate's workers are
removed (they hold GPUs); the failed Job stays for its logs. If the candidate's pods change after
prewarming (a restart loses its graphs), prewarming starts over as a new attempt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kembed.operator import stepwise
from kembed.operator.golden import GoldenRecord
from kembed.operator.jobs import JobRequest
from kembed.operator.spec import EmbeddingModelSpec
from kembed.operator.status import Condition, ConditionType, EmbeddingModelStatus, RolloutState
from kembed.operator.world import Event, Plan, Workers, World

JOB_DEADLINE_GRACE_S = 60  # past activeDeadlineSeconds, a Job still "running" is stuck: block anyway
JOB_KINDS = ("prewarm", "smoke", "golden")
LATER_GATE_FIELDS: dict[str, Any] = {"golden": "Check", "require_digests": False, "max_surge_replicas": None}
FAILED_REASONS = {"prewarm": "PrewarmFailed", "smoke": "SmokeTestFailed", "golden": "GoldenMismatch"}
TIMED_OUT_REASONS = {
    "prewarm": "PrewarmTimedOut",
    "smoke": "SmokeTestTimedOut",
    "golden": "SmokeTestTimedOut",
}


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _age_s(since: str, now: datetime) -> float:
    started = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=now.tzinfo)
    return (now - started).total_seconds()


def set_condition(
    status: EmbeddingModelStatus, type_: ConditionType, value: bool, reason: str, message: str, world: World
) -> EmbeddingModelStatus:
    """`status` with one condition set; lastTransitionTime moves only when the value changes."""
    text: Literal["True", "False"] = "True" if value else "False"
    old = next((c for c in status.conditions if c.type == type_), None)
    changed_at = old.last_transition_time if old is not None and old.status == text else timestamp(world.now)
    new = Condition(
        type=type_,
        status=text,
        reason=reason,
        message=message,
        last_transition_time=changed_at,
        observed_generation=world.generation,
    )
    others = [c for c in status.conditions if c.type != type_]
    return status.model_copy(update={"conditions": sorted([*others, new], key=lambda c: c.type)})


def decide(world: World, status: EmbeddingModelStatus) -> Plan:
    """The plan for `world`, given the status last written. Pure: same inputs, same plan.

    Level-triggered where it matters for serving: a revision whose promotion the gateway has
    finished is promoted whatever the spec asks for now; a promotion in flight when the spec moves
    on to another new revision is finished first (the gateway, rendered from the spec, is never
    pointed at a revision the spec does not describe); a spec back at the serving revision renders
    the gateway back to it; and no revision a gateway pod still points at is deleted."""
    status = status.model_copy(update={"observed_generation": world.generation})
    status, events = _promoted_by_gateway(world, status)
    rollout, active = status.rollout, status.active_revision
    if active and active == world.revision:
        plan = _serve(world, status, events)
    elif rollout is not None and rollout.stage == "Promoting" and rollout.revision != world.revision:
        plan = _finish_promoting(world, status, rollout, events)
    else:
        plan = _roll(world, status, events)
    in_use = world.gateway.in_use if world.gateway is not None else frozenset()
    kept = plan.revisions | (in_use & set(world.workers))
    return dataclasses.replace(plan, revisions=kept, status=_autoscaling(plan.status, world))


def _promoted_by_gateway(
    world: World, status: EmbeddingModelStatus
) -> tuple[EmbeddingModelStatus, tuple[Event, ...]]:
    """The status with a promotion the gateway has finished recorded: its revision active, the old
    one to be retired (once no gateway pod points at it), whatever the spec asks for now."""
    rollout, active = status.rollout, status.active_revision
    if rollout is None or rollout.stage != "Promoting" or not _is_gateway_on(world, rollout.revision):
        return status, ()
    message = f"revision {rollout.revision} serves" + (f"; {active} retired" if active else "")
    promoted = status.model_copy(
        update={"active_revision": rollout.revision, "rollout": None, "candidate_revision": ""}
        | _gated_image(rollout)
    )
    return promoted, (Event("Normal", "Promoted", message),)


def _finish_promoting(
    world: World, status: EmbeddingModelStatus, rollout: RolloutState, events: tuple[Event, ...]
) -> Plan:
    """The spec moved on to a new revision while the gateway was switching to the candidate, which
    passed its gates: let the gateway finish (neither it nor the candidate's workers are rendered
    again, since the spec no longer describes them), then promote it and roll the new one out from
    there. A gateway that does not finish within promoteTimeoutSeconds blocks the candidate; both
    revisions stay while gateway pods point at them, and the next pass rolls the new one out."""
    active, candidate = status.active_revision, rollout.revision
    if _age_s(rollout.stage_started_at, world.now) > world.spec.rollout.promote_timeout_seconds:
        step = _block(world, rollout, "PromoteTimedOut", _promote_timeout_message(world, rollout))
        blocked = status.model_copy(update={"rollout": step.rollout})
        return _roll(world, blocked, (*events, *step.events))
    status = _counts(status, world, active) if active else status
    status = _rollout_conditions(world, status, rollout)
    status = set_condition(
        status,
        "Progressing",
        True,
        "Promoting",
        f"revision {candidate}: the gateway is switching to it; revision {world.revision} (the spec's) "
        "rolls out once it has",
        world,
    )
    return Plan(
        status=status.model_copy(update={"phase": "Progressing", "candidate_revision": candidate}),
        revisions=frozenset(r for r in (active, candidate) if r),
        deploy=None,
        gateway=None,
        events=events,
        autoscaled=active if world.spec.autoscaling.enabled and active else None,
    )


def _promote_timeout_message(world: World, rollout: RolloutState) -> str:
    gateway = world.gateway
    seen = (
        "no gateway Deployment"
        if gateway is None
        else f"gateway on {gateway.revision or 'none'}, rolled out: {gateway.is_rolled_out}, "
        f"{gateway.num_ready} pod(s) ready"
    )
    return (
        f"the gateway did not become available on revision {rollout.revision} within "
        f"{world.spec.rollout.promote_timeout_seconds} s ({seen}); its pods still on the serving "
        "revision keep serving (see the gateway Deployment's pods and events)"
    )


def _autoscaling(status: EmbeddingModelStatus, world: World) -> EmbeddingModelStatus:
    """The Autoscaling condition: whether KEDA can act on the ScaledObject; absent when off."""
    if not world.spec.autoscaling.enabled:
        return status.model_copy(
            update={"conditions": [c for c in status.conditions if c.type != "Autoscaling"]}
        )
    if world.is_autoscaler_missing:
        message = (
            "the cluster serves no keda.sh/v1alpha1 ScaledObject (is KEDA installed?): nothing scales "
            "the workers, which keep their current pod count"
        )
        return set_condition(status, "Autoscaling", False, "KedaMissing", message, world)
    message = "KEDA scales the serving revision's workers on their queued tokens"
    return set_condition(status, "Autoscaling", True, "ScaledObjectApplied", message, world)


# --- serving: no rollout --------------------------------------------------------------------------


def _serve(world: World, status: EmbeddingModelStatus, events: tuple[Event, ...]) -> Plan:
    active = status.active_revision
    workers = world.workers.get(active, Workers(0, ()))
    gateway = world.gateway
    is_switched = gateway is not None and gateway.revision == active and gateway.is_rolled_out
    is_serving = gateway is not None and gateway.num_ready > 0 and workers.num_ready > 0
    wanted = _serving_replicas(world, active)
    is_short = workers.num_ready < wanted
    status = status.model_copy(update={"candidate_revision": "", "rollout": None})
    status, drift = _image_drift(status, workers)
    events = (*events, *drift)
    status = _counts(status, world, active)
    status = set_condition(status, "RolloutBlocked", False, "NotBlocked", "", world)
    status = set_condition(
        status,
        "Progressing",
        not is_switched,
        "GatewayRolling" if not is_switched else "Serving",
        f"revision {active}" + (": the gateway is rolling" if not is_switched else " serves"),
        world,
    )
    status = set_condition(
        status,
        "Ready",
        is_serving,
        "Serving" if is_serving else "NotServing",
        f"{workers.num_ready}/{wanted} workers of {active} ready",
        world,
    )
    status = set_condition(
        status,
        "Degraded",
        is_short,
        "WorkersUnavailable" if is_short else "AllWorkersReady",
        f"{workers.num_ready}/{wanted} workers ready",
        world,
    )
    # Short of workers while serving is a scale-up or a restart under way (the Degraded condition
    # says so); Degraded as a phase means nothing answers.
    phase = "Degraded" if not is_serving else ("Ready" if is_switched and not is_short else "Progressing")
    return Plan(
        status=status.model_copy(update={"phase": phase}),
        revisions=frozenset({active}),
        deploy=active,
        gateway=active,
        events=events,
        worker_replicas=None if world.spec.autoscaling.enabled else world.spec.worker.replicas,
        autoscaled=active if world.spec.autoscaling.enabled else None,
        worker_image_digest=status.active_image_digest if status.active_image_pinned else "",
    )


def _image_drift(
    status: EmbeddingModelStatus, workers: Workers
) -> tuple[EmbeddingModelStatus, tuple[Event, ...]]:
    """A serving pod that runs another worker image than the revision passed its gate with (its tag
    moved, and a node pulled it anew) pins the revision's Deployment to the gated digest: its rolling
    update replaces such pods with the image that passed the gate."""
    gated = status.active_image_digest
    others = workers.image_digests - {gated}
    if not gated or not others or status.active_image_pinned:
        return status, ()
    message = (
        f"revision {status.active_revision}: a serving pod runs worker image {', '.join(sorted(others))}, "
        f"not {gated} that passed the gate (its tag moved): its Deployment now names the gated digest"
    )
    return status.model_copy(update={"active_image_pinned": True}), (Event("Warning", "ImageDrift", message),)


def _counts(status: EmbeddingModelStatus, world: World, serving: str) -> EmbeddingModelStatus:
    ready = world.workers[serving].num_ready if serving in world.workers else 0
    return status.model_copy(update={"replicas": _serving_replicas(world, serving), "ready_replicas": ready})


def _serving_replicas(world: World, revision: str) -> int:
    """Pods the serving revision should have: the autoscaler's count (its Deployment's) or the spec's."""
    if world.spec.autoscaling.enabled:
        return world.workers[revision].replicas if revision in world.workers else 0
    return world.spec.worker.replicas


def _starting_replicas(world: World, active: str) -> int:
    """The candidate's pods under autoscaling: as many as serve now, so the new revision takes the load
    at once; at least one, so that a revision scaled to zero is still gated; within min and max."""
    a = world.spec.autoscaling
    serving = world.workers[active].replicas if active in world.workers else 0
    return min(max(serving, a.min_replicas, 1), a.max_replicas)


def _candidate_replicas(world: World, rollout: RolloutState) -> int:
    """Pods the candidate runs through the gate: fixed at its start under autoscaling, else the spec's,
    and at least one: a revision asked to run on none is gated on one pod all the same (scaled to
    none once it serves), so that a later scale-up never serves a revision no gate has seen."""
    if rollout.step_replicas is not None:  # a stepwise rollout (stepwise.py)
        return rollout.step_replicas
    return _full_replicas(world, rollout)


def _full_replicas(world: World, rollout: RolloutState) -> int:
    """The candidate's pods once it is whole (without steps, from the start)."""
    if world.spec.autoscaling.enabled and rollout.replicas is not None:
        return rollout.replicas
    return max(1, world.spec.worker.replicas)


# --- rolling out a candidate ----------------------------------------------------------------------


def _roll(world: World, status: EmbeddingModelStatus, earlier: tuple[Event, ...] = ()) -> Plan:
    candidate, active = world.revision, status.active_revision
    rollout = status.rollout if status.rollout and status.rollout.revision == candidate else None
    events: list[Event] = list(earlier)
    if rollout is None:
        rollout = _start(world, attempt=1, active=active)
        events.append(Event("Normal", "RolloutStarted", f"rolling out revision {candidate}"))
    elif rollout.stage == "Blocked" and _is_changed_since_block(world, rollout):
        rollout = _start(world, attempt=rollout.attempt + 1, active=active)
        events.append(Event("Normal", "RolloutRetried", f"spec changed: retrying revision {candidate}"))
    if world.spec.autoscaling.enabled and rollout.replicas is None:  # also when turned on mid-rollout
        rollout = replace_state(rollout, replicas=_starting_replicas(world, active))

    step = _step(world, rollout, active)
    # The gate passed in this pass: a golden answer to keep goes with the plan.
    is_gated = rollout.stage == "SmokeTesting" and step.rollout.stage == "Promoting"
    golden = world.golden_records.get(("golden", candidate, rollout.attempt)) if is_gated else None
    rollout, events = step.rollout, events + list(step.events)
    if rollout.stage == "Promoting" and _is_gateway_on(world, candidate):
        promoted = status.model_copy(update={"active_revision": candidate} | _gated_image(rollout))
        message = f"revision {candidate} serves" + (f"; {active} retired" if active else "")
        plan = _serve(
            world, promoted, (*events, *_recorded(golden, candidate), Event("Normal", "Promoted", message))
        )
        return dataclasses.replace(
            plan, golden=golden, golden_revision=candidate if golden else "", golden_at=timestamp(world.now)
        )
    events += _recorded(golden, candidate)

    status = status.model_copy(update={"candidate_revision": candidate, "rollout": rollout})
    status = (
        _counts(status, world, active)
        if active
        else status.model_copy(update={"replicas": _candidate_replicas(world, rollout), "ready_replicas": 0})
    )
    status = _rollout_conditions(world, status, rollout)
    is_blocked = rollout.stage == "Blocked"
    keep_jobs = frozenset((kind, candidate, rollout.attempt) for kind in JOB_KINDS)
    gateway, serving_replicas = stepwise.gateway_and_serving(world, rollout, active)
    return Plan(
        status=status.model_copy(update={"phase": "Blocked" if is_blocked else "Progressing"}),
        revisions=frozenset(r for r in (active, None if is_blocked else candidate) if r),
        deploy=None if is_blocked else candidate,
        gateway=gateway,
        serving_replicas=serving_replicas,
        jobs=step.jobs,
        keep_jobs=keep_jobs,
        events=tuple(events),
        # The candidate is not autoscaled before it serves: its pods are the ones the gate checks.
        worker_replicas=_candidate_replicas(world, rollout),
        autoscaled=active if world.spec.autoscaling.enabled and active else None,
        golden=golden,
        golden_revision=candidate if golden is not None else "",
        golden_at=timestamp(world.now),
    )


def _recorded(golden: GoldenRecord | None, revision: str) -> list[Event]:
    if golden is None:
        return []
    short = golden.weights.removeprefix("sha256:")[:12]
    return [
        Event(
            "Normal", "GoldenRecorded", f"revision {revision}: the golden answer of weights {short} is kept"
        )
    ]


def _gated_image(rollout: RolloutState) -> dict[str, Any]:
    """The status fields of a promoted revision's image: the digest its gated pods ran, not pinned."""
    return {"active_image_digest": rollout.image_digest, "active_image_pinned": False}


def gate_kinds(spec: EmbeddingModelSpec) -> tuple[str, ...]:
    """The Jobs of the SmokeTesting stage: the smoke test, and the golden check unless it is off."""
    return ("smoke",) if spec.rollout.golden == "Off" else ("smoke", "golden")


def _start(world: World, attempt: int, active: str) -> RolloutState:
    surge = world.spec.rollout.max_surge_replicas
    # In steps only beside a serving revision, without the autoscaler (which owns its replicas), and
    # when a step is smaller than the whole.
    is_stepwise = (
        surge is not None
        and bool(active)
        and not world.spec.autoscaling.enabled
        and surge < max(1, world.spec.worker.replicas)
    )
    return RolloutState(
        revision=world.revision,
        stage="Deploying",
        attempt=attempt,
        generation=world.generation,
        stage_started_at=timestamp(world.now),
        step_replicas=surge if is_stepwise else None,
    )


def _is_changed_since_block(world: World, rollout: RolloutState) -> bool:
    """Whether the spec changed since the rollout blocked, scaling aside (a status written before
    spec_hash existed: whether the generation moved on)."""
    if not rollout.spec_hash:
        return rollout.generation != world.generation
    return rollout.spec_hash != gate_hash(world.spec)


def gate_hash(spec: EmbeddingModelSpec) -> str:
    """What a blocked rollout is retried on: the spec without what scaling moves (worker.replicas),
    so that `kubectl scale` of a blocked model does not start its gate again."""
    shaped = spec.model_dump(mode="json")
    shaped["worker"].pop("replicas", None)
    for name, default in LATER_GATE_FIELDS.items():  # newer than spec_hash: their defaults keep it
        if shaped["rollout"].get(name) == default:
            del shaped["rollout"][name]
    canonical = json.dumps(shaped, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _is_gateway_on(world: World, revision: str) -> bool:
    return world.gateway is not None and world.gateway.revision == revision and world.gateway.is_rolled_out


@dataclass(frozen=True)
class _Step:
    rollout: RolloutState
    jobs: tuple[JobRequest, ...] = ()
    events: tuple[Event, ...] = ()


def _enter(world: World, rollout: RolloutState, stage: str, **changes: Any) -> RolloutState:
    return replace_state(rollout, stage=stage, stage_started_at=timestamp(world.now), **changes)


def replace_state(rollout: RolloutState, **changes: Any) -> RolloutState:
    return rollout.model_copy(update=changes)


def _block(world: World, rollout: RolloutState, reason: str, message: str) -> _Step:
    blocked = _enter(
        world,
        rollout,
        "Blocked",
        reason=reason,
        message=message,
        generation=world.generation,
        spec_hash=gate_hash(world.spec),
    )
    text = f"revision {rollout.revision} blocked ({reason}): {message}"
    return _Step(blocked, events=(Event("Warning", "RolloutBlocked", text),))


def _step(world: World, rollout: RolloutState, active: str) -> _Step:
    """One move of the machine from `rollout.stage` on what `world` shows."""
    spec, candidate = world.spec, rollout.revision
    workers = world.workers.get(candidate, Workers(0, ()))
    wanted = _candidate_replicas(world, rollout)
    is_ready = workers.num_ready >= wanted and workers.replicas == wanted
    hot_from = world.workers[active].addresses if active in world.workers else ()

    def request(kind: str, state: RolloutState) -> JobRequest:
        # The golden Job compares each pod with the first: a pod gated in an earlier step goes first.
        targets = (*state.gated[:1], *state.targets) if kind == "golden" else tuple(state.targets)
        return JobRequest(kind, candidate, state.attempt, targets, hot_from if kind == "prewarm" else ())

    def prewarming(state: RolloutState) -> _Step:
        fresh = [a for a in workers.addresses if a not in state.gated]  # without steps: all of them
        state = _enter(world, state, "Prewarming", targets=fresh)
        return _Step(state, jobs=(request("prewarm", state),))

    if rollout.stage == "Blocked":
        return _Step(rollout)
    if rollout.stage == "Deploying":
        if is_ready and len(workers.image_digests) > 1:
            digests = ", ".join(sorted(workers.image_digests))
            message = (
                f"the candidate's pods run different worker images ({digests}): the image's tag moved "
                "while they started; name the image by digest (image@sha256:...)"
            )
            return _block(world, rollout, "ImageMismatch", message)
        if is_ready:
            return prewarming(replace_state(rollout, image_digest=next(iter(workers.image_digests), "")))
        if _age_s(rollout.stage_started_at, world.now) > spec.rollout.ready_timeout_seconds:
            message = (
                f"{workers.num_ready}/{wanted} candidate workers ready after "
                f"{spec.rollout.ready_timeout_seconds} s"
            )
            return _block(world, rollout, "CandidateNotReady", message)
        return _Step(rollout)
    if rollout.stage in ("Prewarming", "SmokeTesting"):
        kinds = ("prewarm",) if rollout.stage == "Prewarming" else gate_kinds(spec)
        if tuple(sorted({*rollout.gated, *rollout.targets})) != workers.addresses:
            # a pod restarted (its graphs are gone) or went: the pods not gated yet are gated again
            gated = [a for a in rollout.gated if a in workers.addresses]
            again = replace_state(rollout, attempt=rollout.attempt + 1, gated=gated)
            return prewarming(again) if is_ready else _Step(_enter(world, again, "Deploying", targets=[]))
        states = {kind: world.jobs.get((kind, candidate, rollout.attempt)) for kind in kinds}
        for kind, state in states.items():
            if state is not None and state.phase == "Failed":
                return _block(world, rollout, FAILED_REASONS[kind], state.message or f"the {kind} Job failed")
        if any(state is None or state.phase == "Running" for state in states.values()):
            timeout = (
                spec.rollout.prewarm_timeout_seconds
                if kinds == ("prewarm",)
                else spec.rollout.smoke_timeout_seconds
            )
            if _age_s(rollout.stage_started_at, world.now) > timeout + JOB_DEADLINE_GRACE_S:
                late = next(k for k, state in states.items() if state is None or state.phase == "Running")
                return _block(
                    world, rollout, TIMED_OUT_REASONS[late], f"the {late} Job did not finish in {timeout} s"
                )
            return _Step(rollout, jobs=tuple(request(kind, rollout) for kind in kinds))
        if kinds == ("prewarm",):
            smoke_testing = _enter(world, rollout, "SmokeTesting")
            return _Step(
                smoke_testing,
                jobs=tuple(request(kind, smoke_testing) for kind in gate_kinds(spec)),
                events=(
                    Event(
                        "Normal",
                        "Prewarmed",
                        f"revision {candidate}: buckets captured on {len(rollout.targets)} pod(s)",
                    ),
                ),
            )
        golden = states.get("golden")
        message = f"revision {candidate}: graph replay matches eager runs" + (
            f"; {golden.message}" if golden is not None and golden.message else ""
        )
        passed = Event("Normal", "SmokeTestPassed", message)
        if rollout.step_replicas is not None:
            is_alike = (
                golden is not None and ("golden", candidate, rollout.attempt) not in world.golden_records
            )
            after, notes = stepwise.after_gate(
                world, rollout, active, is_alike, _full_replicas(world, rollout)
            )
            if after.stage != "Promoting":
                return _Step(_enter(world, after, after.stage), events=(passed, *notes))
        return _Step(_enter(world, rollout, "Promoting"), events=(passed,))
    if rollout.stage == "Mixing":
        if _age_s(rollout.stage_started_at, world.now) > spec.rollout.promote_timeout_seconds:
            return _block(world, rollout, "PromoteTimedOut", _promote_timeout_message(world, rollout))
        if not stepwise.is_gateway_mixed(world, rollout, active):
            return _Step(rollout)
        after, notes = stepwise.next_step(world, rollout, active, _full_replicas(world, rollout))
        return _Step(_enter(world, after, after.stage), events=notes)
    assert rollout.stage == "Promoting", rollout.stage
    if _age_s(rollout.stage_started_at, world.now) > spec.rollout.promote_timeout_seconds:
        return _block(world, rollout, "PromoteTimedOut", _promote_timeout_message(world, rollout))
    return _Step(rollout)


def _rollout_conditions(
    world: World, status: EmbeddingModelStatus, rollout: RolloutState
) -> EmbeddingModelStatus:
    stage, candidate, active = rollout.stage, rollout.revision, status.active_revision
    order = ["Deploying", "Prewarming", "SmokeTesting", "Mixing", "Promoting"]
    reached = order.index(stage) if stage in order else -1
    is_blocked = stage == "Blocked"
    if is_blocked:
        prewarmed = rollout.reason not in ("CandidateNotReady", "PrewarmFailed", "PrewarmTimedOut")
        smoked = False
    else:
        prewarmed, smoked = reached >= 2, reached >= 3
    status = set_condition(
        status,
        "Prewarmed",
        prewarmed,
        "Prewarmed" if prewarmed else "NotPrewarmed",
        f"revision {candidate}",
        world,
    )
    status = set_condition(
        status, "SmokeTestPassed", smoked, "Passed" if smoked else "NotPassed", f"revision {candidate}", world
    )
    status = set_condition(
        status,
        "RolloutBlocked",
        is_blocked,
        rollout.reason if is_blocked else "NotBlocked",
        rollout.message if is_blocked else "",
        world,
    )
    status = set_condition(
        status,
        "Progressing",
        not is_blocked,
        stage if not is_blocked else rollout.reason,
        f"revision {candidate}: {stage} (attempt {rollout.attempt})",
        world,
    )
    serving = world.workers.get(active, Workers(0, ())) if active else Workers(0, ())
    gateway = world.gateway
    is_serving = bool(active) and gateway is not None and gateway.num_ready > 0 and serving.num_ready > 0
    message = f"revision {active} serves" if is_serving else "no revision serves yet"
    status = set_condition(
        status, "Ready", is_serving, "Serving" if is_serving else "NotServing", message, world
    )
    is_short = bool(active) and serving.num_ready < serving.replicas
    return set_condition(
        status,
        "Degraded",
        is_short,
        "WorkersUnavailable" if is_short else "AllWorkersReady",
        f"{serving.num_ready}/{serving.replicas} workers of {active or 'none'} ready",
        world,
    )
