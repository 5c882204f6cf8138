"""Dashboards of the worker's engine: pinned host memory against its cap, and the CUDA graph cache."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from kembed.monitoring import promql as q
from kembed.monitoring.alerts import DEFAULT_THRESHOLDS
from kembed.monitoring.panels import Query, dashboard, graph
from kembed.monitoring.queries import S, worker_gauge, worker_gauge_per_pod, worker_quantiles, worker_rate


def pinned_memory() -> Dashboard:
    fraction = q.pinned_fraction(S)
    return dashboard(
        "kembed-pinned-memory",
        "kembed / Pinned memory",
        "The CUDA engine's pinned result ring against its hard cap (max_pinned_bytes), per worker pod. "
        "When every slot is in flight the next launch waits. The CPU engine has no ring: it reads 0.",
        [
            (
                "Pinned host memory",
                [
                    graph(
                        "In use, reserved and limit per pod",
                        "in_use: slots holding a batch in flight; reserved: slots allocated; limit: the cap.",
                        "bytes",
                        [
                            Query(worker_gauge("kembed_worker_pinned_memory_bytes"), "{{pod}} {{state}}"),
                            Query(worker_gauge("kembed_worker_pinned_memory_limit_bytes"), "{{pod}} limit"),
                        ],
                    ),
                    graph(
                        "In use as a share of the cap",
                        "The pinned-memory alert fires above its threshold (dashed) held for 5 minutes.",
                        "percentunit",
                        [Query(fraction, "{{pod}}")],
                        threshold=DEFAULT_THRESHOLDS.pinned_memory_fraction,
                    ),
                ],
            ),
            (
                "GPU memory",
                [
                    graph(
                        "Device memory held by torch per pod",
                        "The caching allocator, CUDA graph pool included (0 on the CPU engine).",
                        "bytes",
                        [Query(worker_gauge("kembed_worker_gpu_memory_bytes"), "{{pod}}")],
                    ),
                    graph(
                        "Queued tokens per pod",
                        "Backlog that pinned slots and batches drain.",
                        "none",
                        [Query(worker_gauge_per_pod("kembed_worker_queued_tokens"), "{{pod}}")],
                    ),
                ],
            ),
        ],
    )


def graph_cache() -> Dashboard:
    return dashboard(
        "kembed-graph-cache",
        "kembed / Graph cache",
        "CUDA graphs per (sequences, tokens) bucket: captured on a bucket's second hit (or by prewarm), "
        "replayed after. Eager steps by reason: cold (first hit), uncapturable (fits no bucket), "
        "disabled (no graphs: the CPU engine), full (graph cap reached).",
        [
            (
                "Steps",
                [
                    graph(
                        "Replays and eager steps per second",
                        "Graph replays against eager steps by reason.",
                        "ops",
                        [
                            Query(
                                worker_rate("kembed_worker_graph_replays_total", ("revision",)),
                                "replay {{revision}}",
                            ),
                            Query(
                                worker_rate("kembed_worker_eager_steps_total", ("reason", "revision")),
                                "eager {{reason}} {{revision}}",
                            ),
                        ],
                        stacked=True,
                    ),
                    graph(
                        "Cold-hit ratio by revision",
                        "Cold eager steps over cold steps plus replays. High "
                        "after a rollout: the prewarm missed the buckets traffic hits.",
                        "percentunit",
                        [Query(q.cold_fraction(S), "{{revision}}")],
                        threshold=DEFAULT_THRESHOLDS.cold_hit_fraction,
                    ),
                ],
            ),
            (
                "Graphs",
                [
                    graph(
                        "Resident graphs per pod",
                        "Captured graphs held now (capped by max_graphs).",
                        "none",
                        [Query(worker_gauge("kembed_worker_graphs_resident"), "{{pod}}")],
                    ),
                    graph(
                        "Captures per second",
                        "Lazy captures and prewarm captures.",
                        "ops",
                        [Query(worker_rate("kembed_worker_graph_captures_total", ("pod",)), "{{pod}}")],
                    ),
                    graph(
                        "Capture time (p50, p99)",
                        "One capture, warm-up run included.",
                        "s",
                        worker_quantiles("kembed_worker_graph_capture_duration_seconds"),
                    ),
                ],
            ),
        ],
    )
