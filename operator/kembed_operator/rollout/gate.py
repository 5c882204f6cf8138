"""A candidate's gate, one move at a time: Deploying → Prewarming → SmokeTesting (→ Mixing, in
steps) → Promoting, or Blocked with a reason; the Jobs each stage asks for, the pods the candidate runs
through it, and what a blocked rollout is retried on (`gate_hash`). Pure, like rollout.py, which
calls `step` once a pass."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from kembed.operator.build.jobs import JobRequest
from kembed.operator.rollout import stepwise
from kembed.operator.rollout.conditions import age_s, timestamp
from kembed.operator.rollout.world import Event, Workers, World
from kembed.operator.spec.spec import EmbeddingModelSpec
from kembed.operator.spec.status import RolloutState

JOB_DEADLINE_GRACE_S = 60  # past activeDeadlineSeconds, a Job still "running" is stuck: block anyway
JOB_KINDS = ("prewarm", "smoke", "golden")
LATER_GATE_FIELDS: dict[str, Any] = {"golden": "Check", "require_digests": False, "max_surge_replicas": None}
FAILED_REASONS = {"prewarm": "PrewarmFailed", "smoke": "SmokeTestFailed", "golden": "GoldenMismatch"}
TIMED_OUT_REASONS = {
    "prewarm": "PrewarmTimedOut",
    "smoke": "SmokeTestTimedOut",
    "golden": "SmokeTestTimedOut",
}


def gate_kinds(spec: EmbeddingModelSpec) -> tuple[str, ...]:
    """The Jobs of the SmokeTesting stage: the smoke test, and the golden check unless it is off."""
    return ("smoke",) if spec.rollout.golden == "Off" else ("smoke", "golden")


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


def start(world: World, attempt: int, active: str) -> RolloutState:
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


def is_changed_since_block(world: World, rollout: RolloutState) -> bool:
    """Whether the spec changed since the rollout blocked, scaling aside (a status written before
    spec_hash existed: whether the generation moved on)."""
    if not rollout.spec_hash:
        return rollout.generation != world.generation
    return rollout.spec_hash != gate_hash(world.spec)


def candidate_replicas(world: World, rollout: RolloutState) -> int:
    """Pods the candidate runs through the gate: fixed at its start under autoscaling, else the spec's,
    and at least one: a revision asked to run on none is gated on one pod all the same (scaled to
    none once it serves), so that a later scale-up never serves a revision no gate has seen."""
    if rollout.step_replicas is not None:  # a stepwise rollout (stepwise.py)
        return rollout.step_replicas
    return full_replicas(world, rollout)


def full_replicas(world: World, rollout: RolloutState) -> int:
    """The candidate's pods once it is whole (without steps, from the start)."""
    if world.spec.autoscaling.enabled and rollout.replicas is not None:
        return rollout.replicas
    return max(1, world.spec.worker.replicas)


@dataclass(frozen=True)
class Step:
    rollout: RolloutState
    jobs: tuple[JobRequest, ...] = ()
    events: tuple[Event, ...] = ()


def enter(world: World, rollout: RolloutState, stage: str, **changes: Any) -> RolloutState:
    return replace_state(rollout, stage=stage, stage_started_at=timestamp(world.now), **changes)


def replace_state(rollout: RolloutState, **changes: Any) -> RolloutState:
    return rollout.model_copy(update=changes)


def block(world: World, rollout: RolloutState, reason: str, message: str) -> Step:
    blocked = enter(
        world,
        rollout,
        "Blocked",
        reason=reason,
        message=message,
        generation=world.generation,
        spec_hash=gate_hash(world.spec),
    )
    text = f"revision {rollout.revision} blocked ({reason}): {message}"
    return Step(blocked, events=(Event("Warning", "RolloutBlocked", text),))


def promote_timeout_message(world: World, rollout: RolloutState) -> str:
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


def step(world: World, rollout: RolloutState, active: str) -> Step:
    """One move of the machine from `rollout.stage` on what `world` shows."""
    spec, candidate = world.spec, rollout.revision
    workers = world.workers.get(candidate, Workers(0, ()))
    wanted = candidate_replicas(world, rollout)
    is_ready = workers.num_ready >= wanted and workers.replicas == wanted
    hot_from = world.workers[active].addresses if active in world.workers else ()

    def request(kind: str, state: RolloutState) -> JobRequest:
        # The golden Job compares each pod with the first: a pod gated in an earlier step goes first.
        targets = (*state.gated[:1], *state.targets) if kind == "golden" else tuple(state.targets)
        return JobRequest(kind, candidate, state.attempt, targets, hot_from if kind == "prewarm" else ())

    def prewarming(state: RolloutState) -> Step:
        fresh = [a for a in workers.addresses if a not in state.gated]  # without steps: all of them
        state = enter(world, state, "Prewarming", targets=fresh)
        return Step(state, jobs=(request("prewarm", state),))

    if rollout.stage == "Blocked":
        return Step(rollout)
    if rollout.stage == "Deploying":
        if is_ready and len(workers.image_digests) > 1:
            digests = ", ".join(sorted(workers.image_digests))
            message = (
                f"the candidate's pods run different worker images ({digests}): the image's tag moved "
                "while they started; name the image by digest (image@sha256:...)"
            )
            return block(world, rollout, "ImageMismatch", message)
        if is_ready:
            return prewarming(replace_state(rollout, image_digest=next(iter(workers.image_digests), "")))
        if age_s(rollout.stage_started_at, world.now) > spec.rollout.ready_timeout_seconds:
            message = (
                f"{workers.num_ready}/{wanted} candidate workers ready after "
                f"{spec.rollout.ready_timeout_seconds} s"
            )
            return block(world, rollout, "CandidateNotReady", message)
        return Step(rollout)
    if rollout.stage in ("Prewarming", "SmokeTesting"):
        kinds = ("prewarm",) if rollout.stage == "Prewarming" else gate_kinds(spec)
        if tuple(sorted({*rollout.gated, *rollout.targets})) != workers.addresses:
            # a pod restarted (its graphs are gone) or went: the pods not gated yet are gated again
            gated = [a for a in rollout.gated if a in workers.addresses]
            again = replace_state(rollout, attempt=rollout.attempt + 1, gated=gated)
            return prewarming(again) if is_ready else Step(enter(world, again, "Deploying", targets=[]))
        states = {kind: world.jobs.get((kind, candidate, rollout.attempt)) for kind in kinds}
        for kind, state in states.items():
            if state is not None and state.phase == "Failed":
                return block(world, rollout, FAILED_REASONS[kind], state.message or f"the {kind} Job failed")
        if any(state is None or state.phase == "Running" for state in states.values()):
            timeout = (
                spec.rollout.prewarm_timeout_seconds
                if kinds == ("prewarm",)
                else spec.rollout.smoke_timeout_seconds
            )
            if age_s(rollout.stage_started_at, world.now) > timeout + JOB_DEADLINE_GRACE_S:
                late = next(k for k, state in states.items() if state is None or state.phase == "Running")
                return block(
                    world, rollout, TIMED_OUT_REASONS[late], f"the {late} Job did not finish in {timeout} s"
                )
            return Step(rollout, jobs=tuple(request(kind, rollout) for kind in kinds))
        if kinds == ("prewarm",):
            smoke_testing = enter(world, rollout, "SmokeTesting")
            return Step(
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
                world, rollout, active, is_alike, full_replicas(world, rollout)
            )
            if after.stage != "Promoting":
                return Step(enter(world, after, after.stage), events=(passed, *notes))
        return Step(enter(world, rollout, "Promoting"), events=(passed,))
    if rollout.stage == "Mixing":
        if age_s(rollout.stage_started_at, world.now) > spec.rollout.promote_timeout_seconds:
            return block(world, rollout, "PromoteTimedOut", promote_timeout_message(world, rollout))
        if not stepwise.is_gateway_mixed(world, rollout, active):
            return Step(rollout)
        after, notes = stepwise.next_step(world, rollout, active, full_replicas(world, rollout))
        return Step(enter(world, after, after.stage), events=notes)
    assert rollout.stage == "Promoting", rollout.stage
    if age_s(rollout.stage_started_at, world.now) > spec.rollout.promote_timeout_seconds:
        return block(world, rollout, "PromoteTimedOut", promote_timeout_message(world, rollout))
    return Step(rollout)
