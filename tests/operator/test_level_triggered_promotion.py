"""The rollout's plan follows what the gateway actually points at: a change during any stage (a new
revision C while B rolls out over A) never deletes a revision a gateway pod uses, never points the
gateway at a revision the spec does not describe, and a promotion the gateway finished is recorded;
a model asked to run on no pods is still gated; Promoting has a deadline; scaling a blocked model
does not retry it. Over every stage x gateway state, and again after a restart (the plan from the
status just written)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from operator_fakes import example

from kembed.operator.rollout.conditions import timestamp
from kembed.operator.rollout.gate import gate_hash
from kembed.operator.rollout.rollout import decide
from kembed.operator.rollout.world import Gateway, JobState, Workers, World
from kembed.operator.spec.spec import parse_spec
from kembed.operator.spec.status import EmbeddingModelStatus, RolloutState

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
A, B, C = "aaaaaaaa", "bbbbbbbb", "cccccccc"
SPEC = parse_spec(example("minilm-cpu.yaml")["spec"])
WORKERS = {A: Workers(1, ("10.0.1.1:50051",)), B: Workers(1, ("10.0.2.1:50051",))}
JOBS = {("prewarm", B, 1): JobState("Succeeded"), ("smoke", B, 1): JobState("Running")}
STAGES = ["Deploying", "Prewarming", "SmokeTesting", "Promoting", "Blocked"]
GATEWAYS = {  # what the gateway's template points at, whether it is rolled out, its pods' revisions
    "on-A": Gateway(A, True, 1, frozenset({A})),
    "rolling-to-B": Gateway(B, False, 1, frozenset({A, B})),
    "on-B": Gateway(B, True, 1, frozenset({B})),
}


def status_in(stage: str, age_s: float = 10.0) -> EmbeddingModelStatus:
    rollout = RolloutState(
        revision=B,
        stage=stage,
        attempt=1,
        generation=1,
        stage_started_at=timestamp(NOW - timedelta(seconds=age_s)),
        targets=["10.0.2.1:50051"],
        reason="SmokeTestFailed" if stage == "Blocked" else "",
        spec_hash=gate_hash(SPEC) if stage == "Blocked" else "",
    )
    return EmbeddingModelStatus(active_revision=A, candidate_revision=B, rollout=rollout)


def cases() -> list[tuple[str, str]]:
    return [
        (stage, gateway)
        for stage in STAGES
        for gateway in GATEWAYS
        # the gateway points at B only once B is promoting (or was, before a block)
        if gateway == "on-A" or stage in ("Promoting", "Blocked")
    ]


@pytest.mark.parametrize(("stage", "gateway"), cases(), ids=[f"{s}-{g}" for s, g in cases()])
@pytest.mark.parametrize("spec_revision", [B, C, A], ids=["no-change", "change-to-C", "back-to-A"])
def test_a_plan_never_deletes_what_the_gateway_uses_nor_points_it_elsewhere(stage, gateway, spec_revision):
    world = World(SPEC, 2, spec_revision, NOW, WORKERS, JOBS, GATEWAYS[gateway])
    status = status_in(stage)
    for _ in range(3):  # and again, as a restarted operator would from the status just written
        plan = decide(world, status)
        assert GATEWAYS[gateway].in_use <= plan.revisions, (stage, gateway, plan.revisions)
        # the gateway is only ever rendered for the revision the spec describes
        assert plan.gateway in (None, spec_revision)
        # a candidate's workers are only rendered from the spec that describes them
        assert plan.deploy in (None, spec_revision)
        status = plan.status
    if stage == "Promoting" and gateway == "on-B":  # the gateway finished: B was promoted, whatever
        # the spec asks for now (back at A, A rolls out again through the gate, from B)
        assert status.active_revision == B
        assert "Promoted" in {e.reason for e in decide(world, status_in(stage)).events}


def test_a_change_while_the_gateway_switches_finishes_the_promotion_first():
    rolling = World(SPEC, 2, C, NOW, WORKERS, JOBS, GATEWAYS["rolling-to-B"])
    plan = decide(rolling, status_in("Promoting"))
    assert plan.revisions == {A, B} and plan.gateway is None and plan.deploy is None
    assert plan.status.rollout is not None and plan.status.rollout.revision == B
    progressing = next(c for c in plan.status.conditions if c.type == "Progressing")
    assert C in progressing.message and "switching" in progressing.message
    switched = World(SPEC, 2, C, NOW, WORKERS, JOBS, GATEWAYS["on-B"])
    plan = decide(switched, plan.status)
    assert plan.status.active_revision == B
    assert {e.reason for e in plan.events} >= {"Promoted", "RolloutStarted"}
    assert plan.status.rollout is not None and plan.status.rollout.revision == C
    assert plan.revisions == {B, C} and plan.deploy == C  # A retired: no gateway pod points at it


def test_a_spec_back_at_the_serving_revision_renders_the_gateway_back_and_keeps_b_while_used():
    world = World(SPEC, 2, A, NOW, WORKERS, JOBS, GATEWAYS["rolling-to-B"])
    plan = decide(world, status_in("Promoting"))
    assert plan.gateway == A and plan.status.active_revision == A and plan.status.rollout is None
    assert B in plan.revisions  # gateway pods still point at it


def test_promoting_has_a_deadline():
    world = World(SPEC, 1, B, NOW, WORKERS, JOBS, Gateway(B, False, 0, frozenset({A, B})))
    plan = decide(world, status_in("Promoting", age_s=SPEC.rollout.promote_timeout_seconds + 1))
    assert plan.status.rollout is not None and plan.status.rollout.stage == "Blocked"
    blocked = next(c for c in plan.status.conditions if c.type == "RolloutBlocked")
    assert blocked.reason == "PromoteTimedOut" and "gateway did not become available" in blocked.message
    assert plan.status.phase == "Blocked"
    assert plan.revisions == {A, B}  # both still pointed at by gateway pods
    assert "RolloutBlocked" in {e.reason for e in plan.events}
    in_time = decide(world, status_in("Promoting", age_s=SPEC.rollout.promote_timeout_seconds - 1))
    assert in_time.status.rollout is not None and in_time.status.rollout.stage == "Promoting"


def test_a_model_on_no_pods_is_gated_on_one_and_scaled_to_none_once_it_serves():
    spec = SPEC.model_copy(update={"worker": SPEC.worker.model_copy(update={"replicas": 0})})
    world = World(spec, 1, B, NOW, {A: Workers(0, ()), B: Workers(1, ())}, {}, GATEWAYS["on-A"])
    plan = decide(world, status_in("Deploying"))
    assert plan.worker_replicas == 1 and plan.status.rollout.stage == "Deploying"  # not promoted ungated
    ready = World(
        spec, 1, B, NOW, {A: Workers(0, ()), B: Workers(1, ("10.0.2.1:50051",))}, {}, GATEWAYS["on-A"]
    )
    plan = decide(ready, plan.status)
    assert plan.status.rollout.stage == "Prewarming" and [j.kind for j in plan.jobs] == ["prewarm"]
    serving = World(spec, 1, B, NOW, {B: Workers(1, ("10.0.2.1:50051",))}, {}, GATEWAYS["on-B"])
    plan = decide(serving, status_in("Promoting"))
    assert plan.status.active_revision == B and plan.worker_replicas == 0


def test_scaling_a_blocked_model_does_not_retry_it_a_change_does():
    scaled = SPEC.model_copy(update={"worker": SPEC.worker.model_copy(update={"replicas": 3})})
    world = World(scaled, 2, B, NOW, {A: WORKERS[A]}, {}, GATEWAYS["on-A"])
    plan = decide(world, status_in("Blocked"))
    assert plan.status.rollout.stage == "Blocked" and not plan.events
    changed = scaled.model_copy(
        update={"rollout": scaled.rollout.model_copy(update={"ready_timeout_seconds": 60})}
    )
    plan = decide(World(changed, 3, B, NOW, {A: WORKERS[A]}, {}, GATEWAYS["on-A"]), status_in("Blocked"))
    assert plan.status.rollout.stage == "Deploying" and [e.reason for e in plan.events] == ["RolloutRetried"]
