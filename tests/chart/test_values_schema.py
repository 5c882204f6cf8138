"""values.schema.json refuses wrong types, unknown keys and out-of-range values, so that `helm
install` fails at once with the offending path instead of rendering a broken operator."""

import pytest
from chart_tools import HelmFailed

REJECTED = {
    "unknown-top-level-key": ({"replicaCount": 2}, "at '': additional properties 'replicaCount' not allowed"),
    "unknown-nested-key": ({"operator": {"imagee": {}}}, "at '/operator': additional properties 'imagee'"),
    "misspelt-monitor-key": (
        {"metrics": {"serviceMonitor": {"enable": True}}},
        "at '/metrics/serviceMonitor': additional properties 'enable'",
    ),
    "port-as-string": (
        {"metrics": {"port": "9090"}},
        "at '/metrics/port': got string, want integer",
    ),
    "port-out-of-range": ({"metrics": {"port": 70000}}, "at '/metrics/port': maximum"),
    "interval-below-minimum": (
        {"operator": {"reconcileIntervalSeconds": 0.5}},
        "at '/operator/reconcileIntervalSeconds': minimum: got 0.5, want 1",
    ),
    "log-level-not-in-enum": (
        {"operator": {"logLevel": "verbose"}},
        "at '/operator/logLevel': value must be one of",
    ),
    "pull-policy-not-in-enum": (
        {"operator": {"image": {"pullPolicy": "Sometimes"}}},
        "at '/operator/image/pullPolicy': value must be one of",
    ),
    "boolean-as-string": (
        {"rbac": {"clusterWide": "yes"}},
        "at '/rbac/clusterWide': got string, want boolean",
    ),
    "namespace-not-a-dns-label": (
        {"operator": {"watchNamespaces": ["Search"]}},
        "at '/operator/watchNamespaces/0': 'Search' does not match pattern",
    ),
    "namespace-twice": (
        {"operator": {"watchNamespaces": ["search", "search"]}},
        "at '/operator/watchNamespaces': items at 0 and 1 are equal",
    ),
    "digest-not-sha256": (
        {"operator": {"image": {"digest": "latest"}}},
        "at '/operator/image/digest': 'latest' does not match pattern",
    ),
    "image-prefix-with-a-tag": (
        {"imagePrefix": "my.registry/team/kembed:0.1.0"},
        "at '/imagePrefix': 'my.registry/team/kembed:0.1.0' does not match pattern",
    ),
    "image-tag-as-number": ({"imageTag": 2}, "at '/imageTag': got number, want string"),
    "label-value-not-a-string": (
        {"commonLabels": {"team": 7}},
        "at '/commonLabels/team': got number, want string",
    ),
    "resources-unknown-key": (
        {"operator": {"resources": {"request": {"cpu": "1"}}}},
        "at '/operator/resources': additional properties 'request'",
    ),
    "alert-fraction-above-one": (
        {"prometheusRule": {"thresholds": {"pinnedMemoryFraction": 90}}},
        "at '/prometheusRule/thresholds/pinnedMemoryFraction': maximum: got 90, want 1",
    ),
    "misspelt-alert-threshold": (
        {"prometheusRule": {"thresholds": {"latencyP99": 0.2}}},
        "at '/prometheusRule/thresholds': additional properties 'latencyP99'",
    ),
    "network-policy-cidr-not-a-cidr": (
        {"networkPolicy": {"apiServer": {"cidrs": ["kubernetes.default"]}}},
        "at '/networkPolicy/apiServer/cidrs/0': 'kubernetes.default' does not match pattern",
    ),
    "network-policy-without-api-ports": (
        {"networkPolicy": {"apiServer": {"ports": []}}},
        "at '/networkPolicy/apiServer/ports': minItems",
    ),
    "network-policy-unknown-key": (
        {"networkPolicy": {"egress": []}},
        "at '/networkPolicy': additional properties 'egress'",
    ),
    "hot-list-interval-negative": (
        {"operator": {"hotBucketsIntervalSeconds": -1}},
        "at '/operator/hotBucketsIntervalSeconds': minimum",
    ),
    "scrape-interval-not-a-duration": (
        {"metrics": {"enabled": True, "serviceMonitor": {"enabled": True, "interval": "often"}}},
        "at '/metrics/serviceMonitor/interval': 'often' does not match pattern",
    ),
}


@pytest.mark.parametrize(("values", "message"), REJECTED.values(), ids=REJECTED.keys())
def test_schema_rejects_bad_values_naming_the_path(helm_template, values, message):
    with pytest.raises(HelmFailed) as refused:
        helm_template(values)
    assert "values don't meet the specifications of the schema" in str(refused.value)
    assert message in str(refused.value)


def test_schema_applies_to_set_flags_too(helm_template):
    with pytest.raises(HelmFailed, match="at '/operator/logLevel': value must be one of"):
        helm_template(None, "--set", "operator.logLevel=TRACE")


def test_monitor_without_metrics_fails_saying_what_to_enable(helm_template):
    with pytest.raises(HelmFailed, match=r"need metrics\.enabled=true"):
        helm_template({"metrics": {"serviceMonitor": {"enabled": True}}})


def test_metrics_cannot_take_the_liveness_port(helm_template):
    with pytest.raises(HelmFailed, match=r"metrics\.port 8081 is the operator's liveness port"):
        helm_template({"metrics": {"enabled": True, "port": 8081}})


def test_existing_service_account_must_be_named(helm_template):
    with pytest.raises(HelmFailed, match=r"serviceAccount\.name must name an existing ServiceAccount"):
        helm_template({"serviceAccount": {"create": False}})
