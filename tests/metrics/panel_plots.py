"""PNG plots of what the latency and pinned-memory dashboards show, from the observed run's Prometheus
(`make metrics-plots` writes them into docs/). Grafana cannot run here: these are the same panel
queries, variables substituted as Grafana would, legends as the panels format them."""

from __future__ import annotations

import math
import re
from pathlib import Path

from metrics_load import PHASES
from panel_queries import load, resolve_variables, substitute

RATE_INTERVAL = "10s"
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def panel_series(run, dashboard: str, title: str, start: float, end: float) -> list[tuple[str, list, list]]:
    """(legend, seconds since the load began, values) of every series of one panel's targets."""
    [panel] = [p for p in load(dashboard)["panels"] if p.get("title") == title]
    choices = resolve_variables(run.prometheus, dashboard, start, end)
    out = []
    for target in panel["targets"]:
        expr = substitute(target["expr"], choices, RATE_INTERVAL, "")
        for series in run.prometheus.query_range(expr, start, end):
            legend = LEGEND_LABEL.sub(lambda m, s=series: s["metric"].get(m[1], ""), target["legendFormat"])
            times = [float(t) - run.load_start for t, _ in series["values"]]
            values = [float(v) for _, v in series["values"]]
            out.append((legend, times, values))
    return sorted(out)


def shade_phases(axis) -> None:
    """The load's phases behind the lines: concurrency 1, 8, 2, then idle."""
    t = 0.0
    for phase in PHASES:
        axis.axvspan(t, t + phase.seconds, color="tab:gray", alpha=0.04 * phase.concurrency, lw=0)
        axis.text(t + 0.3, 0.97, f"{phase.concurrency} client{'s' * (phase.concurrency > 1)}",
                  transform=axis.get_xaxis_transform(), va="top", fontsize=7, color="dimgray")  # fmt: skip
        t += phase.seconds
    axis.text(
        t + 0.3, 0.97, "idle", transform=axis.get_xaxis_transform(), va="top", fontsize=7, color="dimgray"
    )


def draw(axis, series, title: str, unit: str, styles=None) -> None:
    for legend, times, values in series:
        finite = [(t, v) for t, v in zip(times, values, strict=True) if math.isfinite(v)]
        if not finite:
            continue
        style = styles(legend) if styles else {}
        axis.plot(*zip(*finite, strict=True), label=legend, lw=1.3, **style)
    shade_phases(axis)
    axis.set_title(title, fontsize=10)
    axis.set_ylabel(unit, fontsize=8)
    axis.set_xlabel("seconds since the load began", fontsize=8)
    axis.tick_params(labelsize=7)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=6.5, ncol=2, loc="best", framealpha=0.85)


def quantile_style(legend: str) -> dict:
    return {"ls": {"p50": ":", "p95": "--"}.get(legend.split()[0], "-")}


def plot_run(run, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, end = run.load_start - 2, run.end
    out_dir.mkdir(parents=True, exist_ok=True)

    latency = "kembed-latency"
    figure, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    for axis, (title, styles) in zip(
        axes.flat,
        [
            ("Request latency by route (p50, p95, p99)", quantile_style),
            ("p99 by stage", None),
            ("Queue wait (p50, p99) by revision", quantile_style),
            ("Batch time (p50, p99) by revision", quantile_style),
        ],
        strict=True,
    ):
        draw(axis, panel_series(run, latency, title, start, end), title, "seconds", styles)
    axes.flat[0].set_yscale("log")
    axes.flat[1].set_yscale("log")
    figure.suptitle(
        "kembed / Latency dashboard, from a real Prometheus: gateway + 2 CPU workers (all-MiniLM-L6-v2), "
        "rate interval 10 s",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(out_dir / "metrics-latency.png", dpi=110)
    plt.close(figure)

    pinned = "kembed-pinned-memory"
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    memory = [
        (legend, times, [v / 2**20 for v in values])
        for legend, times, values in panel_series(
            run, pinned, "In use, reserved and limit per pod", start, end
        )
    ]
    draw(axes[0], memory, "In use, reserved and limit per pod", "MiB",
         lambda legend: {"ls": "--" if legend.endswith("limit") else "-"})  # fmt: skip
    axes[0].set_ylim(-10, 1.4 * max(max(values) for _, _, values in memory))
    axes[0].text(
        0.02, 0.5, "CPU engine: no pinned ring,\nin_use and reserved read 0\n(the limit is max_pinned_bytes)",
        transform=axes[0].transAxes, fontsize=8, color="firebrick",
    )  # fmt: skip
    draw(axes[1], panel_series(run, pinned, "Queued tokens per pod", start, end), "Queued tokens per pod",
         "tokens")  # fmt: skip
    figure.suptitle(
        "kembed / Pinned memory dashboard on the CPU engine: the pinned gauges stay 0; the queue they "
        "drain rises with load and returns to 0",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(out_dir / "metrics-pinned-memory.png", dpi=110)
    plt.close(figure)
