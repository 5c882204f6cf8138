"""One version: pyproject.toml's, as installed, is what the gateway and the worker report and what the
chart deploys."""

import re
import tomllib
from pathlib import Path

from kembed.proto.version import VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_the_reported_version_is_pyprojects_and_the_charts_app_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["version"] == VERSION
    chart = (ROOT / "charts/kembed/Chart.yaml").read_text(encoding="utf-8")
    assert re.search(r'^appVersion: "?([^"\n]+)"?$', chart, re.M).group(1) == VERSION
