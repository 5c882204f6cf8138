"""What `make dashboards` writes into the chart, and the writing: each dashboard's JSON under
charts/kembed/dashboards/ and the PrometheusRule template. A test regenerates and compares, so a
change here without `make dashboards` fails it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import Dashboard

from kembed.monitoring.alerts import chart_template
from kembed.monitoring.engine_dashboards import graph_cache, pinned_memory
from kembed.monitoring.panels import to_json
from kembed.monitoring.request_dashboards import batching, latency, throughput_errors
from kembed.monitoring.rollout_dashboard import rollouts

CHART_DIR = Path(__file__).resolve().parents[1] / "charts" / "kembed"
DASHBOARD_DIR = CHART_DIR / "dashboards"
RULE_TEMPLATE = CHART_DIR / "templates" / "prometheusrule.yaml"

# File name (without .json, also the ConfigMap's suffix and the dashboard's uid) -> dashboard.
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "kembed-latency": latency,
    "kembed-pinned-memory": pinned_memory,
    "kembed-graph-cache": graph_cache,
    "kembed-batching": batching,
    "kembed-throughput-errors": throughput_errors,
    "kembed-rollouts": rollouts,
}


def outputs(chart_dir: Path = CHART_DIR) -> dict[Path, str]:
    """Every generated file's path and text."""
    files = {
        chart_dir / "dashboards" / f"{name}.json": to_json(build()) for name, build in DASHBOARDS.items()
    }
    files[chart_dir / "templates" / RULE_TEMPLATE.name] = chart_template()
    return files


def stale(chart_dir: Path = CHART_DIR) -> list[Path]:
    """Generated files that are missing or differ, and dashboards nobody generates any more."""
    expected = outputs(chart_dir)
    wrong = [path for path, text in expected.items() if not path.is_file() or path.read_text() != text]
    extra = [path for path in sorted((chart_dir / "dashboards").glob("*.json")) if path not in expected]
    return wrong + extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -P -m kembed.monitoring", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say which files are stale (exit 1)")
    args = parser.parse_args(argv)
    if args.check:
        paths = stale()
        for path in paths:
            print(f"stale: {path.relative_to(CHART_DIR.parents[1])}")
        return 1 if paths else 0
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        path.unlink()  # a dashboard removed from DASHBOARDS leaves no file behind
    for path, text in outputs().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(CHART_DIR.parents[1])}")
    return 0
