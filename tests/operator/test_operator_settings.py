"""Operator settings: flags win over `KEMBED_OPERATOR_*`, which win over the defaults."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from kembed.operator.settings import OperatorSettings, parse_settings


def test_defaults_watch_every_namespace():
    assert parse_settings([], env={}) == OperatorSettings()
    assert OperatorSettings().namespaces == ()


def test_environment_then_flags():
    env = {"KEMBED_OPERATOR_NAMESPACES": "ml, search", "KEMBED_OPERATOR_RECONCILE_INTERVAL_S": "3"}
    settings = parse_settings([], env=env)
    assert settings.namespaces == ("ml", "search") and settings.reconcile_interval_s == 3.0
    flagged = parse_settings(["-n", "prod", "--worker-image", "w:2"], env=env)
    assert flagged.namespaces == ("prod",) and flagged.worker_image == "w:2"


def test_default_images_are_what_make_images_tags_by_default():
    """Outside the chart (which always sets them) the operator's default images are the ones `make
    images` builds without IMAGE_PREFIX or IMAGE_TAG: its default prefix, the package version."""
    repo = Path(__file__).resolve().parents[2]
    version = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]
    [prefix] = re.findall(r"^IMAGE_PREFIX \?= (\S+)$", (repo / "Makefile").read_text(), re.M)
    assert OperatorSettings().worker_image == f"{prefix}/worker:{version}"
    assert OperatorSettings().gateway_image == f"{prefix}/gateway:{version}"
