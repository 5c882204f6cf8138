"""The opt-in PrometheusRule: off by default, labelled for a Prometheus to select, the rules exactly
those kembed.monitoring generates with the thresholds from values, accepted by `promtool check rules`
and passing the promtool unit tests in alerts.promtool.yaml (firing, and holding back, as meant)."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_tools import CHART_DIR, find
from values_cases import CUSTOMISED

from kembed.monitoring.alerts import Thresholds, alerts, rule_groups, threshold_values

UNIT_TESTS = Path(__file__).with_name("alerts.promtool.yaml")
ENABLED = {"prometheusRule": {"enabled": True}}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not on PATH: `make prometheus-tools` installs it (Debian: prometheus)")
    return found


def rules_of(docs: list[dict]) -> list[dict]:
    [rule] = find(docs, "PrometheusRule")
    return rule["spec"]["groups"]


def test_no_rule_unless_enabled(helm_template):
    assert not find(helm_template(), "PrometheusRule")


def test_rule_is_labelled_for_the_prometheus_that_selects_it(helm_template):
    [rule] = find(helm_template(CUSTOMISED), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_chart_rules_are_the_generated_rules_with_the_values_thresholds(helm_template):
    assert rules_of(helm_template(ENABLED)) == rule_groups()
    custom = CUSTOMISED["prometheusRule"]["thresholds"]
    thresholds = Thresholds(
        latency_p99_seconds=custom["latencyP99Seconds"],
        pinned_memory_fraction=custom["pinnedMemoryFraction"],
        cold_hit_fraction=custom["coldHitFraction"],
        server_error_fraction=custom["serverErrorFraction"],
    )
    assert rules_of(helm_template(CUSTOMISED)) == rule_groups(thresholds)


def test_values_yaml_thresholds_are_the_generated_defaults(helm_template):
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["prometheusRule"]["thresholds"] == threshold_values()


def test_promtool_accepts_the_rendered_rules(helm_template, promtool, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rules_of(helm_template(CUSTOMISED))}))
    done = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout + done.stderr


def test_promtool_unit_tests_pass_on_the_rendered_rules(helm_template, promtool, tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules_of(helm_template(ENABLED))}))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    done = subprocess.run(
        [promtool, "test", "rules", UNIT_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
