"""Operator settings: flags win over `KEMBED_OPERATOR_*`, which win over the defaults."""

from __future__ import annotations

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
