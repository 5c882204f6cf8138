"""Dashboards of the request path: latency by stage, throughput and errors, batching."""

from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard

from kembed.monitoring import promql as q
from kembed.monitoring.alerts import DEFAULT_THRESHOLDS
from kembed.monitoring.panels import Query, dashboard, graph
from kembed.monitoring.queries import (
    QUANTILES,
    S,
    gateway_quantiles,
    gateway_rate,
    request_latency,
    worker_gauge,
    worker_gauge_per_pod,
    worker_quantiles,
    worker_rate,
)


def latency() -> Dashboard:
    stages = [
        Query(request_latency((0.99,), ())[0].expr, "gateway request"),
        Query(gateway_quantiles("kembed_gateway_tokenize_duration_seconds", (0.99,))[0].expr, "tokenize"),
        Query(worker_quantiles("kembed_worker_queue_wait_seconds", (0.99,), ())[0].expr, "worker queue wait"),
        Query(worker_quantiles("kembed_worker_batch_duration_seconds", (0.99,), ())[0].expr, "worker batch"),
    ]
    return dashboard(
        "kembed-latency",
        "kembed / Latency",
        "Where a request's time goes: the gateway (by route), tokenization, the worker's queue and its "
        "batches. Quantiles from the services' histograms (buckets a quarter octave apart, 15 µs to "
        "64 s: within 10 % for spread latencies, 19 % at worst).",
        [
            (
                "Gateway",
                [
                    graph(
                        "Request latency by route (p50, p95, p99)",
                        "Arrival to response at the gateway, by route, for the routes that do work.",
                        "s",
                        request_latency(QUANTILES, ("route",)),
                        threshold=DEFAULT_THRESHOLDS.latency_p99_seconds,
                    ),
                    graph(
                        "p99 by stage",
                        "The slowest stage is the one to look at first: the gateway's whole "
                        "request, its tokenization, the worker's queue wait and batch time.",
                        "s",
                        stages,
                    ),
                    graph(
                        "Tokenize time (p50, p95, p99)",
                        "Tokenizing one request's inputs on the gateway.",
                        "s",
                        gateway_quantiles("kembed_gateway_tokenize_duration_seconds", QUANTILES),
                    ),
                ],
            ),
            (
                "Worker",
                [
                    graph(
                        "Queue wait (p50, p99) by revision",
                        "Admission until the request's first sequence is launched in a batch.",
                        "s",
                        worker_quantiles("kembed_worker_queue_wait_seconds"),
                    ),
                    graph(
                        "Batch time (p50, p99) by revision",
                        "Launch (packing included) until a batch's rows are on the host.",
                        "s",
                        worker_quantiles("kembed_worker_batch_duration_seconds"),
                    ),
                    graph(
                        "Batch time by stage (p99)",
                        "Where a batch's time goes: packing on the event loop, the hand-off to the "
                        "launcher thread and the step's CPU work, the device (and the copy of the "
                        "rows), the hand-off back to the event loop.",
                        "s",
                        worker_quantiles("kembed_worker_batch_stage_seconds", (0.99,), ("stage",)),
                    ),
                    graph(
                        "Worker request time (p50, p99) by revision",
                        "Admission to answer in the worker: queue wait plus the batches it spans.",
                        "s",
                        worker_quantiles("kembed_worker_request_duration_seconds"),
                    ),
                ],
            ),
        ],
    )


def throughput_errors() -> Dashboard:
    work = q.routes(q.WORK_ROUTES)
    requests = "kembed_gateway_request_duration_seconds_count"
    failed = gateway_rate(requests, (), work, 'code=~"[45].."')
    return dashboard(
        "kembed-throughput-errors",
        "kembed / Throughput and errors",
        "Requests, inputs and tokens per second through the gateways and workers; errors by class.",
        [
            (
                "Availability",
                [
                    graph(
                        "Server errors, share of answered requests",
                        "5xx (501 aside; 504 included) over the requests answered (499 aside) on the routes "
                        "that reach the workers, per gateway pod: KembedServerErrorsHigh's signal (per model "
                        "there; its threshold dashed). No line: no traffic.",
                        "percentunit",
                        [Query(q.server_error_fraction(S, ("pod",)), "{{pod}}")],
                        threshold=DEFAULT_THRESHOLDS.server_error_fraction,
                    ),
                    graph(
                        "Serving workers per gateway pod",
                        "Worker replicas each gateway can send to now; 0 on every gateway of a model is "
                        "KembedNoServingWorker (/ready answers 503 meanwhile).",
                        "none",
                        [Query(q.serving_workers(S, ("pod",)), "{{pod}}")],
                    ),
                ],
            ),
            (
                "Throughput",
                [
                    graph(
                        "Requests per second by route and status",
                        "Routes that do work.",
                        "reqps",
                        [Query(gateway_rate(requests, ("route", "code"), work), "{{route}} {{code}}")],
                    ),
                    graph(
                        "Inputs and tokens per second",
                        "Sent to the workers, after templates and truncation.",
                        "ops",
                        [
                            Query(
                                gateway_rate("kembed_gateway_request_inputs_sum", ("model",)),
                                "inputs {{model}}",
                            ),
                            Query(
                                gateway_rate("kembed_gateway_request_tokens_sum", ("model",)),
                                "tokens {{model}}",
                            ),
                        ],
                    ),
                    graph(
                        "Worker tokens per second by revision",
                        "Real tokens the workers ran.",
                        "ops",
                        [Query(worker_rate("kembed_worker_batch_tokens_sum", ("revision",)), "{{revision}}")],
                    ),
                    graph(
                        "Worker requests per second by revision",
                        "Embed and Score calls answered.",
                        "reqps",
                        [
                            Query(
                                worker_rate("kembed_worker_request_duration_seconds_count", ("revision",)),
                                "{{revision}}",
                            )
                        ],
                    ),
                ],
            ),
            (
                "Errors",
                [
                    graph(
                        "Errors per second by reason",
                        "Error answers by class (docs/metrics.md).",
                        "ops",
                        [Query(gateway_rate("kembed_gateway_errors_total", ("reason",)), "{{reason}}")],
                        stacked=True,
                    ),
                    graph(
                        "Share of requests answered with an error",
                        "4xx and 5xx over all, routes that do work.",
                        "percentunit",
                        [Query(q.ratio(failed, gateway_rate(requests, (), work)), "errors")],
                    ),
                    graph(
                        "Upstream retries and hedges per second",
                        "Chunks sent again to another replica after one refused (full queue), was down or "
                        "stalled (retries); chunks also sent to a second replica because the first ran past "
                        "its hedge budget (hedges), and those the second answered first (wins).",
                        "ops",
                        [
                            Query(
                                gateway_rate("kembed_gateway_upstream_retries_total", ("pod",)),
                                "retries {{pod}}",
                            ),
                            Query(gateway_rate("kembed_gateway_hedges_total", ("pod",)), "hedges {{pod}}"),
                            Query(
                                gateway_rate("kembed_gateway_hedge_wins_total", ("pod",)),
                                "hedge wins {{pod}}",
                            ),
                        ],
                    ),
                ],
            ),
        ],
    )


def batching() -> Dashboard:
    def mean_fill() -> str:
        tokens = worker_rate("kembed_worker_batch_tokens_sum", ("revision",))
        batches = worker_rate("kembed_worker_batch_tokens_count", ("revision",))
        budget = f"max by (revision) ({worker_gauge('kembed_worker_max_batch_tokens')})"
        return f"{q.ratio(tokens, batches)} / {budget}"

    return dashboard(
        "kembed-batching",
        "kembed / Batching",
        "What the scheduler packs: real tokens and sequences per batch against the budgets it enforces "
        "(max_batch_tokens, max_batch_sequences), the backlog against the admission cap, and the two "
        "classes of work (interactive, served first; bulk).",
        [
            (
                "Batches",
                [
                    graph(
                        "Tokens per batch (p50, p99) against the budget",
                        "Real (unpadded) tokens per batch.",
                        "none",
                        [
                            *worker_quantiles("kembed_worker_batch_tokens"),
                            Query(
                                f"max by (revision) ({worker_gauge('kembed_worker_max_batch_tokens')})",
                                "budget {{revision}}",
                            ),
                        ],
                    ),
                    graph(
                        "Sequences per batch (p50, p99) against the cap",
                        "Sequences per launched batch.",
                        "none",
                        [
                            *worker_quantiles("kembed_worker_batch_sequences"),
                            Query(
                                f"max by (revision) ({worker_gauge('kembed_worker_max_batch_sequences')})",
                                "cap {{revision}}",
                            ),
                        ],
                    ),
                    graph(
                        "Mean batch fill",
                        "Mean real tokens per batch over the token budget.",
                        "percentunit",
                        [Query(mean_fill(), "{{revision}}")],
                    ),
                    graph(
                        "Batches per second by revision",
                        "Launched batches.",
                        "ops",
                        [
                            Query(
                                worker_rate("kembed_worker_batch_tokens_count", ("revision",)), "{{revision}}"
                            )
                        ],
                    ),
                ],
            ),
            (
                "Queue",
                [
                    graph(
                        "Queued tokens per pod against the admission cap",
                        "Tokens admitted and not yet answered; past the cap a request is refused (the "
                        "gateway retries it on another replica).",
                        "none",
                        [
                            Query(worker_gauge_per_pod("kembed_worker_queued_tokens"), "{{pod}}"),
                            Query(worker_gauge("kembed_worker_max_queued_tokens"), "cap {{pod}}"),
                        ],
                    ),
                    graph(
                        "Gateway requests in flight per pod",
                        "Received and not yet answered.",
                        "none",
                        [Query(q.of_gateways(q.series("kembed_gateway_inflight_requests", S), S), "{{pod}}")],
                    ),
                ],
            ),
            ("Classes", classes()),
            ("Interactive lane", [lane_panel()]),
        ],
    )


def lane_panel() -> timeseries.Panel:
    """How often queries met bulk on the workers: the batches their interactive lane ran."""
    return graph(
        "Batches per second: all, and on the interactive lane",
        "On CUDA workers, while bulk keeps the main path busy, interactive batches run on a lane of "
        "their own (a second stream, beside the bulk steps): the lane's share of batches shows how "
        "often queries met bulk. No lane (CPU, flashinfer, or turned off): the lane's line stays 0.",
        "ops",
        [
            Query(worker_rate("kembed_worker_batch_tokens_count", ()), "all batches"),
            Query(worker_rate("kembed_worker_lane_batches_total", ()), "interactive lane"),
        ],
    )


def classes() -> list[timeseries.Panel]:
    """The batching dashboard's row on the two classes of work: a worker serves interactive requests
    first and lets bulk fill the room (worker/scheduling/queues.py), so bulk's wait grows with
    interactive load while interactive's should not grow with bulk."""
    return [
        graph(
            "Queue wait p99 by class",
            "Admission until a request's first sequence is launched, per class: interactive should stay "
            "low whatever the bulk backlog; bulk waits behind it, until it has waited bulk_max_wait_s.",
            "s",
            worker_quantiles("kembed_worker_queue_wait_seconds", (0.99,), ("class",)),
        ),
        graph(
            "Queued tokens by class",
            "Tokens admitted and not yet answered, all selected workers together.",
            "none",
            [Query(f"sum by (class) ({worker_gauge('kembed_worker_queued_tokens')})", "{{class}}")],
            stacked=True,
        ),
        graph(
            "Worker tokens per second by class",
            "Real tokens launched in batches, by the class of their request.",
            "ops",
            [Query(worker_rate("kembed_worker_batch_class_tokens_total", ("class",)), "{{class}}")],
            stacked=True,
        ),
        graph(
            "Gateway requests per second by class",
            "Requests the gateways admitted, by class: what X-Kembed-Priority says, else by size.",
            "reqps",
            [Query(gateway_rate("kembed_gateway_class_requests_total", ("class",)), "{{class}}")],
            stacked=True,
        ),
    ]
