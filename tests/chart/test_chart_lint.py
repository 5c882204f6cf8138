"""`helm lint --strict` accepts the chart with its defaults and with every non-default value set."""

import json
import tomllib

import pytest
import yaml
from chart_tools import CHART_DIR, REPO_ROOT, HelmFailed, run
from values_cases import REQUIRED, VALUE_SETS


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_strict_passes(k8s_tools, tmp_path, values):
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps({**REQUIRED, **values}))
    done = run([k8s_tools.helm, "lint", "--strict", CHART_DIR, "--values", values_file])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_chart_app_version_is_the_package_version():
    """The images `make images` builds are tagged with the package version; the chart's default tags
    are its appVersion. The two must not drift apart."""
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"]


@pytest.mark.parametrize(("version", "accepted"), [("1.30.0", False), ("1.31.0", True), ("1.35.0", True)])
def test_chart_requires_kubernetes_1_31(helm_template, version, accepted):
    """1.31 is the oldest release the chart is validated against (and the first with image volumes,
    one of the EmbeddingModel weight sources)."""
    if accepted:
        assert helm_template(None, "--kube-version", version)
    else:
        with pytest.raises(HelmFailed, match=r"incompatible with Kubernetes v1\.30\.0"):
            helm_template(None, "--kube-version", version)
