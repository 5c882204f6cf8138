"""One version: pyproject.toml's, as installed, is what the gateway and the worker report (the chart's
appVersion is checked against it in tests/chart)."""

import tomllib
from pathlib import Path

from kembed.proto.version import VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_the_reported_version_is_pyprojects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["version"] == VERSION
