"""Every dashboard panel and every alert, evaluated by a real Prometheus that scraped a real gateway,
two real CPU workers, a second gateway cut off from its worker and the operator's metrics under a
short load (conftest.py): each query runs without error and returns data, except those only a GPU
engine feeds, listed below with the reason and checked to read 0 (or NaN) on the CPU; the cut-off
gateway reads as an outage, the blocked model fires its alert by name. `promtool check metrics` is
clean on every /metrics.
"""

from __future__ import annotations

import math
import subprocess

import httpx
import pytest
from observed_run import GATEWAY_POD, LOST_GATEWAY_POD, NAMESPACE
from panel_queries import all_panel_queries, panel_queries, resolve_variables, substitute
from prom_server import tool

from kembed.monitoring import promql as q
from kembed.monitoring.alerts import DEFAULT_THRESHOLDS, alerts
from kembed.monitoring.generate import DASHBOARDS

# One observed run (conftest.py's module fixture) for every test here: all on one xdist worker.
pytestmark = pytest.mark.xdist_group("observed-run")

RATE_INTERVAL = "10s"  # what Grafana's $__rate_interval is at a 1 s scrape interval, rounded up

# Panel queries (dashboard / panel / refId) that only the CUDA engine feeds: on the CPU engine their
# series exist and read 0, or NaN where they are a ratio or quantile of zeros.
GPU_ONLY = {
    "kembed-pinned-memory / In use, reserved and limit per pod / A": "the pinned result ring is the "
    "CUDA engine's; the CPU engine reports in_use and reserved as 0 (the limit, ref B, is real)",
    "kembed-pinned-memory / In use as a share of the cap / A": "in_use is 0 without a pinned ring",
    "kembed-pinned-memory / Device memory held by torch per pod / A": "torch's CUDA caching allocator",
    "kembed-graph-cache / Replays and eager steps per second / A": "graph replays: the CPU engine runs "
    "every step eagerly (ref B, eager steps by reason, is real: reason=disabled)",
    "kembed-graph-cache / Cold-hit ratio by revision / A": "cold over cold plus replays: 0/0 on the CPU",
    "kembed-graph-cache / Resident graphs per pod / A": "no CUDA graphs on the CPU",
    "kembed-graph-cache / Captures per second / A": "no CUDA graphs on the CPU",
    "kembed-graph-cache / Capture time (p50, p99) / A": "no captures: a quantile of an empty histogram",
    "kembed-graph-cache / Capture time (p50, p99) / B": "no captures: a quantile of an empty histogram",
    "kembed-batching / Batches per second: all, and on the interactive lane / B": "the interactive "
    "lane is the CUDA engine's (a second stream); the CPU engine has none (ref A, all batches, is real)",
}
# Panel queries whose series the run makes exist but cannot make move for certain (never on the CPU
# or the GPU alike): the test asks only that they are there.
MAY_READ_ZERO = {
    "kembed-throughput-errors / Upstream retries and hedges per second / C": "a hedge wins only when "
    "the second replica answers before the first; the run hedges (its gateway's budget is 1 ms flat, ref B "
    "is real) but which attempt answers first is the machine's timing",
}
ALERTS_GPU_ONLY = {
    "KembedPinnedMemoryNearCap": "pinned memory in use is 0 without the CUDA engine's ring",
    "KembedColdHitRatioHigh": "no graph-eligible steps on the CPU: 0/0",
}


def values_of(result: list[dict]) -> list[float]:
    samples = [s for series in result for s in series.get("values", [series.get("value")]) if s]
    return [float(value) for _, value in samples]


def has_data(values: list[float]) -> bool:
    return any(math.isfinite(v) and v != 0 for v in values)


def window(observed) -> tuple[float, float, str]:
    start = observed.load_start - 2
    return start, observed.end, f"{math.ceil(observed.end - start) + 1}s"


@pytest.fixture(scope="module")
def choices(observed) -> dict[str, dict[str, list[str]]]:
    start, end, _ = window(observed)
    return {name: resolve_variables(observed.prometheus, name, start, end) for name in DASHBOARDS}


def test_every_target_was_scraped_throughout(observed):
    """Nearly every scrape succeeded, and every target is up at the end. Not every one: the load
    saturates this 2-core machine, and a scrape that waits past its 1 s timeout for a busy gateway's
    event loop counts as down for that second."""
    _, end, range_ = window(observed)
    expected = {(t.job, t.pod) for t in observed.targets}
    scraped = observed.prometheus.query(f"avg_over_time(up[{range_}])", end)
    assert {(s["metric"]["job"], s["metric"]["pod"]) for s in scraped} == expected
    for series in scraped:
        assert float(series["value"][1]) >= 0.9, series
    now = observed.prometheus.query("up", end)
    assert {(s["metric"]["job"], s["metric"]["pod"]): float(s["value"][1]) for s in now} == dict.fromkeys(
        expected, 1.0
    )


def test_the_load_exercised_every_route_and_the_retry_path(observed):
    statuses = observed.statuses
    for path in ("/v1/embeddings", "/embed", "/tokenize"):
        assert statuses[(path, 200)] > 0, path
    assert statuses[("/rerank", 501)] > 0  # an embedding model does not rerank
    assert statuses[("/v1/embeddings", 400)] > 0  # empty input (OpenAI says 400)
    retries = observed.prometheus.query("sum(kembed_gateway_upstream_retries_total)", observed.end)
    assert float(retries[0]["value"][1]) > 0, "rev-b's small queue never refused a chunk"
    hedges = observed.prometheus.query("sum(kembed_gateway_hedges_total)", observed.end)
    assert float(hedges[0]["value"][1]) >= 10, "a 1 ms budget and the throttle's first 10: hedges"


def test_variables_list_what_the_pods_run(choices):
    for name, variables in choices.items():
        assert variables["namespace"] == [NAMESPACE], name
        assert variables["model"] == ["sentence-transformers/all-MiniLM-L6-v2"], name
        assert variables["revision"] == ["rev-a", "rev-b"], name


def test_the_gpu_only_list_names_real_queries():
    keys = {query.key for query in all_panel_queries()}
    assert set(GPU_ONLY) <= keys, set(GPU_ONLY) - keys
    assert set(MAY_READ_ZERO) <= keys, set(MAY_READ_ZERO) - keys
    assert set(ALERTS_GPU_ONLY) <= {alert.name for alert in alerts()}


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_query_returns_data(observed, choices, name):
    start, end, range_ = window(observed)
    empty, gpu_only_with_data = [], []
    for query in panel_queries(name):
        expr = substitute(query.expr, choices[name], RATE_INTERVAL, range_)
        if query.is_instant:
            result = observed.prometheus.query(expr, end)
        else:
            result = observed.prometheus.query_range(expr, start, end)
        assert result, f"{query.key}: no series for {expr}"
        values = values_of(result)
        if query.key in GPU_ONLY:
            if has_data(values):
                gpu_only_with_data.append(query.key)
        elif not has_data(values) and query.key not in MAY_READ_ZERO:
            empty.append(f"{query.key}: only 0/NaN for {expr}")
    assert not empty, "\n".join(empty)
    assert not gpu_only_with_data, f"these show data on the CPU: not GPU-only any more: {gpu_only_with_data}"


def test_every_alert_rule_is_loaded_and_evaluates_without_error(observed):
    groups = observed.prometheus.api("/api/v1/rules")["groups"]
    rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert set(rules) == {alert.name for alert in alerts()}
    for name, rule in rules.items():
        assert rule["health"] == "ok" and not rule.get("lastError"), (name, rule.get("lastError"))


@pytest.mark.parametrize("alert", alerts(), ids=lambda alert: alert.name)
def test_every_alert_signal_returns_data(observed, alert):
    result = observed.prometheus.query(alert.signal, observed.end)
    assert result, f"{alert.name}: no series for {alert.signal}"
    values = values_of(result)
    if alert.name in ALERTS_GPU_ONLY:
        assert not has_data(values), f"{alert.name} shows data on the CPU: not GPU-only any more"
    else:
        assert has_data(values), f"{alert.name}: only 0/NaN"


def test_the_blocked_rollout_fires_its_alert_naming_the_model(observed):
    firing = observed.prometheus.api("/api/v1/alerts")["alerts"]
    blocked = [a for a in firing if a["labels"]["alertname"] == "KembedRolloutBlocked"]
    assert [a["state"] for a in blocked] == ["firing"]
    # the fakes' model (ml/minilm), not the operator's namespace; minilm-next is Progressing
    assert {k: blocked[0]["labels"][k] for k in ("namespace", "model")} == {
        "namespace": "ml",
        "model": "minilm",
    }


def per_pod(observed, expr: str) -> dict[str, float]:
    return {s["metric"]["pod"]: float(s["value"][1]) for s in observed.prometheus.query(expr, observed.end)}


def test_the_gateway_without_a_worker_reads_as_an_outage(observed):
    """The availability alerts' signals, per gateway pod, from real gateways: the one cut off from
    its worker answered every request 503 and reports no serving worker; the other did not."""
    assert observed.lost_statuses[("/v1/embeddings", 503)] > 0
    assert set(observed.lost_statuses) == {("/v1/embeddings", 503)}
    errors = per_pod(observed, q.server_error_fraction(q.ALERTS, ("pod",)))
    assert errors[LOST_GATEWAY_POD] == 1
    assert errors[GATEWAY_POD] < DEFAULT_THRESHOLDS.server_error_fraction
    assert per_pod(observed, q.serving_workers(q.ALERTS, ("pod",))) == {GATEWAY_POD: 2, LOST_GATEWAY_POD: 0}


@pytest.mark.parametrize("job", ["gateway", "worker", "operator"])
def test_promtool_check_metrics_is_clean(observed, job):
    for target in (t for t in observed.targets if t.job == job):
        text = httpx.get(f"http://{target.address}{target.path}", timeout=10).text
        done = subprocess.run(
            [tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (target.pod, done.stdout)


def test_queue_gauges_rise_under_load_and_return_to_idle(observed):
    """What moves with load on the CPU engine: queued tokens and requests in flight. The pinned gauges
    are the CUDA engine's (GPU-only): on the CPU they stay 0 throughout, under their limit."""
    prometheus, end = observed.prometheus, observed.end
    busy = f"{math.ceil(observed.load_end - observed.load_start)}s"
    at_load_end = observed.load_end
    for metric in ("kembed_worker_queued_tokens", "kembed_gateway_inflight_requests"):
        peak = prometheus.query(f"sum(max_over_time({metric}[{busy}]))", at_load_end)
        assert float(peak[0]["value"][1]) > 0, f"{metric} never rose under load"
        idle = prometheus.query(f"sum({metric})", end)
        assert float(idle[0]["value"][1]) == 0, f"{metric} did not return to 0"
    pinned = prometheus.query(f"max(max_over_time(kembed_worker_pinned_memory_bytes[{busy}]))", at_load_end)
    assert float(pinned[0]["value"][1]) == 0
    limit = prometheus.query("min(kembed_worker_pinned_memory_limit_bytes)", end)
    assert float(limit[0]["value"][1]) == 256 << 20  # the default max_pinned_bytes
