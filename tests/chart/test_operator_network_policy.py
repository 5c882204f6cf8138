"""The opt-in NetworkPolicy over the operator pod: it selects exactly the operator's pod; egress only
to the API server, to the metrics port of the worker pods the operator renders (in the namespaces it
watches: checked against a rendered worker pod template, not labels written down here), DNS and
what extraEgress adds; ingress only to the metrics port, from the namespaces named."""

from __future__ import annotations

import pytest
from chart_tools import NAMESPACE, find
from values_cases import CUSTOMISED, NETWORK_POLICY

from kembed.operator.build import manifests as m
from kembed.operator.build.naming import Owner
from kembed.operator.spec.spec import parse_spec

NAME_LABEL = "kubernetes.io/metadata.name"


def policy(helm_template, values: dict) -> dict:
    [body] = find(helm_template(values), "NetworkPolicy")
    return body


def worker_template() -> dict:
    spec = parse_spec({"model": {"source": {"hostPath": {"path": "/m"}}}})
    return m.worker_deployment(Owner("model", "search", "u"), spec, "abcd1234", "w:1")["spec"]["template"]


def egress_by_port(body: dict) -> dict:
    return {str(rule["ports"][0]["port"]): rule for rule in body["spec"]["egress"]}


def test_there_is_none_unless_asked(helm_template):
    assert find(helm_template(), "NetworkPolicy") == []


def test_it_selects_the_operator_pod_and_restricts_both_directions(helm_template):
    docs = helm_template(NETWORK_POLICY)
    [body] = find(docs, "NetworkPolicy")
    [deployment] = find(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert body["metadata"]["namespace"] == NAMESPACE
    assert body["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert body["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert body["spec"]["ingress"] == []  # metrics off: nothing may connect (probes are the kubelet's)


def test_egress_reaches_the_api_server_the_workers_metrics_and_dns_only(helm_template):
    rules = egress_by_port(policy(helm_template, NETWORK_POLICY))
    assert set(rules) == {"443", "metrics", "53"}
    api = rules["443"]
    assert [p["port"] for p in api["ports"]] == [443, 6443] and "to" not in api  # any address
    assert {p["protocol"] for p in rules["53"]["ports"]} == {"UDP", "TCP"}
    (peer,) = rules["metrics"]["to"]
    template = worker_template()
    assert peer["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    ports = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert "metrics" in ports  # the named port the rule opens exists on the worker pods
    expression = {"key": NAME_LABEL, "operator": "In", "values": [NAMESPACE]}
    assert peer["namespaceSelector"] == {"matchExpressions": [expression]}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"operator": {"watchNamespaces": ["search", "recs"]}},
            {"matchExpressions": [{"key": NAME_LABEL, "operator": "In", "values": ["search", "recs"]}]},
        ),
        ({"rbac": {"clusterWide": True}}, {}),
    ],
    ids=["watched-namespaces", "every-namespace"],
)
def test_the_workers_reached_are_those_of_the_watched_namespaces(helm_template, values, expected):
    rules = egress_by_port(policy(helm_template, {**NETWORK_POLICY, **values}))
    (peer,) = rules["metrics"]["to"]
    assert peer["namespaceSelector"] == expected


def test_metrics_ingress_comes_only_from_the_named_namespaces(helm_template):
    body = policy(helm_template, CUSTOMISED)
    (rule,) = body["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9100}]
    assert rule["from"] == [
        {
            "namespaceSelector": {
                "matchExpressions": [{"key": NAME_LABEL, "operator": "In", "values": ["monitoring"]}]
            }
        }
    ]
    anyone = policy(helm_template, {**NETWORK_POLICY, "metrics": {"enabled": True}})
    assert anyone["spec"]["ingress"][0]["from"] == [{"namespaceSelector": {}}]


def test_api_server_cidrs_dns_off_and_extra_egress(helm_template):
    rules = policy(helm_template, CUSTOMISED)["spec"]["egress"]
    api, workers, extra = rules  # no DNS rule
    assert api["ports"] == [{"protocol": "TCP", "port": 6443}]
    assert api["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}, {"ipBlock": {"cidr": "fd00::1/128"}}]
    assert workers["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    assert extra == CUSTOMISED["networkPolicy"]["extraEgress"][0]
