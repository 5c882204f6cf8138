"""The dashboards and alerts are generated: the chart's copies are fresh, every dashboard filters by
namespace, model and revision, every panel queries the datasource variable, and ids are unique; the
batching dashboard shows the two classes of work, and every query parses (promtool)."""

import json
import shutil
import subprocess

import pytest
import yaml

from kembed.monitoring.generate import DASHBOARD_DIR, DASHBOARDS, stale

VARIABLES = ["datasource", "namespace", "model", "revision"]
# The batching dashboard's row on the classes: panel title -> the series its one query reads.
CLASSES_ROW = {
    "Queue wait p99 by class": "kembed_worker_queue_wait_seconds_bucket",
    "Queued tokens by class": "kembed_worker_queued_tokens",
    "Worker tokens per second by class": "kembed_worker_batch_class_tokens_total",
    "Gateway requests per second by class": "kembed_gateway_class_requests_total",
}
# Gauges split by `class`: a panel of one series per pod must sum over it.
CLASS_GAUGES = ("kembed_worker_queued_tokens",)


def load(name: str) -> dict:
    return json.loads((DASHBOARD_DIR / f"{name}.json").read_text())


def test_chart_files_are_what_the_code_generates():
    paths = stale()
    assert not paths, f"stale or unexpected, run `make dashboards`: {[str(p) for p in paths]}"


def test_the_issue_s_dashboards_are_all_there():
    assert set(DASHBOARDS) >= {
        "kembed-latency",
        "kembed-pinned-memory",
        "kembed-graph-cache",
        "kembed-batching",
        "kembed-throughput-errors",
        "kembed-rollouts",
    }


@pytest.mark.parametrize("name", DASHBOARDS)
def test_variables_narrow_namespace_then_model_then_revision(name):
    variables = {v["name"]: v for v in load(name)["templating"]["list"]}
    assert list(variables) == VARIABLES
    assert variables["datasource"]["query"] == "prometheus"
    for variable in VARIABLES[1:]:
        assert variables[variable]["multi"] and variables[variable]["includeAll"], variable
        assert variables[variable]["allValue"] == ".+", variable
    assert "$namespace" in variables["model"]["query"]
    assert "$model" in variables["revision"]["query"]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_queries_the_datasource_variable(name):
    board = load(name)
    assert board["uid"] == name
    panels = [p for p in board["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and 0 not in ids
    assert panels
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(refs), panel["title"]
        assert all(t["expr"] for t in panel["targets"]), panel["title"]
        assert panel["gridPos"]["w"] > 0 and panel["gridPos"]["h"] > 0


def row(board: dict, title: str) -> list[dict]:
    """The panels under the row called `title`, up to the next row."""
    panels = board["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title)
    end = next((i for i in range(start + 1, len(panels)) if panels[i]["type"] == "row"), len(panels))
    return panels[start + 1 : end]


def test_the_batching_dashboard_shows_each_class():
    panels = {panel["title"]: panel for panel in row(load("kembed-batching"), "Classes")}
    assert list(panels) == list(CLASSES_ROW)
    for title, series in CLASSES_ROW.items():
        [target] = panels[title]["targets"]
        assert series + "{" in target["expr"], title
        assert "sum by (class" in target["expr"], title  # one line per class, pods and revisions summed
        assert "{{class}}" in target["legendFormat"], title


def test_the_batching_dashboard_shows_the_interactive_lanes_share_of_batches():
    [panel] = row(load("kembed-batching"), "Interactive lane")
    exprs = [target["expr"] for target in panel["targets"]]
    assert any("kembed_worker_lane_batches_total{" in expr for expr in exprs)
    assert any("kembed_worker_batch_tokens_count{" in expr for expr in exprs)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_a_gauge_split_by_class_is_summed_over_it_or_kept_by_it(name):
    for panel in (p for p in load(name)["panels"] if p["type"] != "row"):
        for target in panel["targets"]:
            for gauge in CLASS_GAUGES:
                if gauge + "{" in target["expr"]:
                    expr = target["expr"]
                    assert "sum without (class)" in expr or "sum by (class" in expr, panel["title"]


def test_every_dashboard_query_parses(tmp_path):
    """Each panel query as a recording rule, Grafana's interval variables given a value (the others
    sit inside label matchers' strings): `promtool check rules` parses every expression."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not on PATH: `make prometheus-tools` installs it (Debian: prometheus)")
    rules = [
        {
            "record": f"kembed:parse:{name.replace('-', '_')}:{panel['id']}:{target['refId']}",
            "expr": target["expr"].replace("$__rate_interval", "1m").replace("$__range", "1h"),
        }
        for name in DASHBOARDS
        for panel in load(name)["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(rules)} rules found" in done.stdout
