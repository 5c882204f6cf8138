"""The rollouts dashboard: revisions serving, and the operator's view (each model's phase, the gate's
Jobs and outcomes, reconciles).

Operator panels follow none of the variables: the operator runs in its own namespace and counts for
every model it reconciles.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from kembed.monitoring import promql as q
from kembed.monitoring.panels import Query, dashboard, graph, total
from kembed.monitoring.queries import S, worker_rate


def model_phases(*matchers: str) -> str:
    """kembed_operator_model_phase, one series per model and phase whichever operator pod reported it
    (two, briefly, while the operator's Deployment rolls)."""
    phases = q.series("kembed_operator_model_phase", q.ALERTS, *matchers)
    return f"max by (model_namespace, model, phase) ({phases})"


def rollouts() -> Dashboard:
    op = q.Scope(window=S.window)  # the operator's own namespace, whatever the variables say
    jobs = q.increase("kembed_operator_job_duration_seconds_sum", op, window="$__range")
    job_count = q.increase("kembed_operator_job_duration_seconds_count", op, window="$__range")
    outcomes = q.increase("kembed_operator_rollouts_total", op, window="$__range")
    pods = q.series("kembed_worker_info", S, S.model, S.revision)
    return dashboard(
        "kembed-rollouts",
        "kembed / Rollouts",
        "Revisions serving, and the operator's view: each model's phase, the rollout gate's prewarm and "
        "smoke-test Jobs, rollouts promoted or blocked, reconciles. Operator panels cover every model the "
        "operator reconciles.",
        [
            (
                "Revisions",
                [
                    graph(
                        "Worker pods by revision",
                        "Pods per revision: two revisions at once is a rollout.",
                        "none",
                        [
                            Query(
                                f"count by (model, revision) ({pods})",
                                "{{model}} {{revision}}",
                            )
                        ],
                    ),
                    graph(
                        "Worker requests per second by revision",
                        "Traffic moving to the new revision.",
                        "reqps",
                        [
                            Query(
                                worker_rate("kembed_worker_request_duration_seconds_count", ("revision",)),
                                "{{revision}}",
                            )
                        ],
                        stacked=True,
                    ),
                ],
            ),
            (
                "Operator",
                [
                    graph(
                        "EmbeddingModels by phase",
                        "Models the operator reconciles, by the phase of the status it wrote: Ready, "
                        "Progressing (a rollout or a scale-up under way), Blocked (the gate refused a "
                        "revision; KembedRolloutBlocked), Degraded (nothing answers), Invalid, Pending.",
                        "none",
                        [Query(f"sum by (phase) ({model_phases()})", "{{phase}}")],
                        stacked=True,
                    ),
                    total(
                        "EmbeddingModels not Ready (now)",
                        "Each model in another phase than Ready, named with its namespace and phase.",
                        "none",
                        [
                            Query(
                                model_phases('phase!="Ready"') + " == 1",
                                "{{model_namespace}}/{{model}} {{phase}}",
                            )
                        ],
                    ),
                    total(
                        "Rollouts ended at the gate (time range)",
                        "Promoted (prewarm and smoke passed) or "
                        "blocked (the old revision keeps serving; the model shows RolloutBlocked).",
                        "none",
                        [
                            Query(
                                f"sum by (result) ({outcomes})",
                                "{{result}}",
                            )
                        ],
                    ),
                    total(
                        "Mean Job duration by kind and result (time range)",
                        "Prewarm and smoke-test Jobs.",
                        "s",
                        [
                            Query(
                                f"sum by (kind, result) ({jobs}) / sum by (kind, result) ({job_count})",
                                "{{kind}} {{result}}",
                            )
                        ],
                    ),
                    graph(
                        "Reconciles per second by result",
                        "ok, invalid (bad spec), retry, error.",
                        "ops",
                        [
                            Query(
                                f"sum by (result) ({q.rate('kembed_operator_reconciles_total', op)})",
                                "{{result}}",
                            )
                        ],
                        stacked=True,
                    ),
                    graph(
                        "Reconcile time (p50, p99)",
                        "Read the world, decide, apply.",
                        "s",
                        [
                            Query(
                                q.quantile(
                                    p, q.rate("kembed_operator_reconcile_duration_seconds_bucket", op)
                                ),
                                f"p{p * 100:g}",
                            )
                            for p in (0.5, 0.99)
                        ],
                    ),
                ],
            ),
        ],
    )
