"""The dashboards and alerts are generated: the chart's copies are fresh, every dashboard filters by
namespace, model and revision, every panel queries the datasource variable, and ids are unique."""

import json

import pytest

from kembed.monitoring.generate import DASHBOARD_DIR, DASHBOARDS, stale

VARIABLES = ["datasource", "namespace", "model", "revision"]


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
