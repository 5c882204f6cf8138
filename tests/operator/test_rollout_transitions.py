"""Every transition of the rollout state machine, table-driven: (stage, what the world shows) →
(next stage, Jobs wanted, events, phase)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from operator_fakes import example

from kembed.operator.rollout.conditions import timestamp
from kembed.operator.rollout.rollout import decide
from kembed.operator.rollout.world import Gateway, JobState, Workers, World
from kembed.operator.spec.spec import parse_spec
from kembed.operator.spec.status import EmbeddingModelStatus, RolloutState

SPEC = parse_spec(example("minilm-cpu.yaml")["spec"])  # one worker replica, timeouts 1800/900/600 s
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
OLD, NEW = "aaaaaaaa", "bbbbbbbb"
SERVING = Workers(1, ("10.0.1.1:50051",))
CANDIDATE = Workers(1, ("10.0.2.1:50051",))
GATEWAY_OLD = Gateway(OLD, is_rolled_out=True, num_ready=1)


@dataclass
class Case:
    stage: str | None  # rollout stage before (None: no rollout yet)
    workers: dict = field(default_factory=lambda: {OLD: SERVING, NEW: CANDIDATE})
    jobs: dict = field(default_factory=dict)
    gateway: Gateway | None = GATEWAY_OLD
    age_s: float = 10  # seconds in the stage so far
    targets: tuple = ("10.0.2.1:50051",)
    generation: int = 1
    # expected
    next_stage: str | None = None
    want_jobs: tuple = ()
    events: tuple = ()
    phase: str = "Progressing"
    active: str = OLD


CASES = {
    "new-revision-starts-deploying": Case(
        None, workers={OLD: SERVING}, targets=(), next_stage="Deploying", events=("RolloutStarted",)
    ),
    "candidate-not-ready-waits": Case(
        "Deploying", workers={OLD: SERVING, NEW: Workers(1, ())}, targets=(), next_stage="Deploying"
    ),
    "candidate-ready-starts-prewarm": Case(
        "Deploying", targets=(), next_stage="Prewarming", want_jobs=(("prewarm", 1, ("10.0.1.1:50051",)),)
    ),
    "candidate-never-ready-blocks": Case(
        "Deploying",
        workers={OLD: SERVING, NEW: Workers(1, ())},
        age_s=1801,
        targets=(),
        next_stage="Blocked",
        events=("RolloutBlocked",),
        phase="Blocked",
    ),
    "prewarm-running-waits": Case(
        "Prewarming",
        jobs={("prewarm", NEW, 1): JobState("Running")},
        next_stage="Prewarming",
        want_jobs=(("prewarm", 1, ("10.0.1.1:50051",)),),
    ),
    "prewarm-job-missing-is-recreated": Case(
        "Prewarming", next_stage="Prewarming", want_jobs=(("prewarm", 1, ("10.0.1.1:50051",)),)
    ),
    "prewarm-ok-starts-smoke": Case(
        "Prewarming",
        jobs={("prewarm", NEW, 1): JobState("Succeeded")},
        next_stage="SmokeTesting",
        want_jobs=(("smoke", 1, ()), ("golden", 1, ())),
        events=("Prewarmed",),
    ),
    "prewarm-failed-blocks": Case(
        "Prewarming",
        jobs={("prewarm", NEW, 1): JobState("Failed", "exit 1")},
        next_stage="Blocked",
        events=("RolloutBlocked",),
        phase="Blocked",
    ),
    "prewarm-stuck-past-deadline-blocks": Case(
        "Prewarming",
        jobs={("prewarm", NEW, 1): JobState("Running")},
        age_s=961,
        next_stage="Blocked",
        events=("RolloutBlocked",),
        phase="Blocked",
    ),
    "pod-restarted-after-prewarm-prewarms-again": Case(
        "SmokeTesting",
        targets=("10.0.2.9:50051",),
        jobs={("smoke", NEW, 1): JobState("Running")},
        next_stage="Prewarming",
        want_jobs=(("prewarm", 2, ("10.0.1.1:50051",)),),
    ),
    "smoke-and-golden-ok-promotes": Case(
        "SmokeTesting",
        jobs={("smoke", NEW, 1): JobState("Succeeded"), ("golden", NEW, 1): JobState("Succeeded")},
        next_stage="Promoting",
        events=("SmokeTestPassed",),
    ),
    "smoke-ok-golden-running-waits": Case(
        "SmokeTesting",
        jobs={("smoke", NEW, 1): JobState("Succeeded"), ("golden", NEW, 1): JobState("Running")},
        next_stage="SmokeTesting",
        want_jobs=(("smoke", 1, ()), ("golden", 1, ())),
    ),
    "golden-mismatch-blocks-while-smoke-runs": Case(
        "SmokeTesting",
        jobs={("smoke", NEW, 1): JobState("Running"), ("golden", NEW, 1): JobState("Failed", "text 3")},
        next_stage="Blocked",
        events=("RolloutBlocked",),
        phase="Blocked",
    ),
    "golden-job-stuck-past-deadline-blocks": Case(
        "SmokeTesting",
        jobs={("smoke", NEW, 1): JobState("Succeeded")},
        age_s=661,
        next_stage="Blocked",
        events=("RolloutBlocked",),
        phase="Blocked",
    ),
    "smoke-failed-blocks": Case(
        "SmokeTesting",
        jobs={("smoke", NEW, 1): JobState("Failed", "cosine 0.2")},
        next_stage="Blocked",
        events=("RolloutBlocked",),
        phase="Blocked",
    ),
    "gateway-rolling-waits": Case(
        "Promoting", gateway=Gateway(NEW, is_rolled_out=False, num_ready=1), next_stage="Promoting"
    ),
    "gateway-switched-retires-old": Case(
        "Promoting",
        gateway=Gateway(NEW, is_rolled_out=True, num_ready=1),
        next_stage=None,
        events=("Promoted",),
        phase="Ready",
        active=NEW,
    ),
    "blocked-stays-blocked": Case("Blocked", next_stage="Blocked", phase="Blocked"),
    "blocked-retries-on-spec-change": Case(
        "Blocked",
        workers={OLD: SERVING},
        generation=2,
        targets=(),
        next_stage="Deploying",
        events=("RolloutRetried",),
    ),
}


def status_before(case: Case) -> EmbeddingModelStatus:
    rollout = None
    if case.stage is not None:
        rollout = RolloutState(
            revision=NEW,
            stage=case.stage,
            attempt=1,
            generation=1,
            stage_started_at=timestamp(NOW - timedelta(seconds=case.age_s)),
            targets=list(case.targets),
            reason="SmokeTestFailed" if case.stage == "Blocked" else "",
        )
    return EmbeddingModelStatus(
        active_revision=OLD, candidate_revision=NEW if rollout else "", rollout=rollout
    )


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_transition(case):
    world = World(SPEC, case.generation, NEW, NOW, case.workers, case.jobs, case.gateway)
    plan = decide(world, status_before(case))
    status = plan.status
    assert (status.rollout.stage if status.rollout else None) == case.next_stage
    assert [(r.kind, r.attempt, r.hot_from) for r in plan.jobs] == [
        (kind, attempt, hot) for kind, attempt, hot in case.want_jobs
    ]
    assert tuple(e.reason for e in plan.events) == case.events
    assert status.phase == case.phase
    assert status.active_revision == case.active
    # The serving revision is never removed before the gateway has left it.
    assert OLD in plan.revisions or case.active == NEW
    # A blocked candidate gives its workers back; the gateway is left pointing at the old revision.
    if case.next_stage == "Blocked":
        assert plan.revisions == {OLD} and plan.gateway is None and plan.deploy is None


def test_blocked_condition_carries_the_job_report():
    case = CASES["smoke-failed-blocks"]
    world = World(SPEC, 1, NEW, NOW, case.workers, case.jobs, case.gateway)
    status = decide(world, status_before(case)).status
    blocked = next(c for c in status.conditions if c.type == "RolloutBlocked")
    assert (blocked.status, blocked.reason, blocked.message) == ("True", "SmokeTestFailed", "cosine 0.2")
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert ready.status == "True"  # the old revision still answers


def test_first_install_promotes_without_hot_buckets():
    world = World(SPEC, 1, NEW, NOW, {NEW: CANDIDATE}, {}, None)
    plan = decide(
        world,
        EmbeddingModelStatus(
            rollout=RolloutState(revision=NEW, stage="Deploying", stage_started_at=timestamp(NOW))
        ),
    )
    (job,) = plan.jobs
    assert job.kind == "prewarm" and job.hot_from == () and job.targets == ("10.0.2.1:50051",)
    assert plan.status.phase == "Progressing"
    assert next(c for c in plan.status.conditions if c.type == "Ready").status == "False"


def test_condition_transition_time_moves_only_on_change():
    case = CASES["prewarm-running-waits"]
    world = World(SPEC, 1, NEW, NOW, case.workers, case.jobs, case.gateway)
    first = decide(world, status_before(case)).status
    later = World(SPEC, 1, NEW, NOW + timedelta(seconds=30), case.workers, case.jobs, case.gateway)
    second = decide(later, first).status
    assert [c.last_transition_time for c in first.conditions] == [
        c.last_transition_time for c in second.conditions
    ]
