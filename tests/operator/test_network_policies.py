"""spec.networkPolicy: the worker pods take gRPC and data only from exactly the pods the operator
renders for this model's gateway and rollout Jobs (selectors checked against the rendered pod
templates, not against labels written down here), metrics only from the namespaces named; the gateway
takes HTTP from everyone unless gatewayFrom says otherwise; the ports named exist on the pods; bad
peers are refused; every variant is valid Kubernetes."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pydantic
import pytest
from operator_fakes import example

from kembed.operator.build import jobs as j
from kembed.operator.build import manifests as m
from kembed.operator.build import policies as p
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.crd import build_crd
from kembed.operator.spec.spec import parse_spec

IMAGE = "registry.test/kembed/worker:1"
OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")
OTHER = Owner("other", "ml", "0b8c1f8e-0000-4000-8000-000000000002")  # another model, same namespace
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def spec_with(**network_policy):
    body = example("minilm-cpu.yaml")["spec"]
    if network_policy:
        body["networkPolicy"] = network_policy
    return parse_spec(body)


def pods(owner: Owner, spec) -> dict[str, dict]:
    """Every pod template the operator renders for `owner`, by role: the labels and ports pods get."""
    old, new = "aaaa1111", revision_of(spec, IMAGE)
    targets = ("10.0.0.1:50051",)
    templates = {
        "worker-old": m.worker_deployment(owner, spec, old, IMAGE),
        "worker-new": m.worker_deployment(owner, spec, new, IMAGE),
        "gateway": m.gateway_deployment(owner, spec, new, "gw"),
        "prewarm": j.job(owner, spec, j.JobRequest("prewarm", new, 1, targets, ("10.0.9.1:50051",)), IMAGE),
        "smoke": j.job(owner, spec, j.JobRequest("smoke", new, 2, targets), IMAGE),
    }
    return {role: body["spec"]["template"] for role, body in templates.items()}


def matches(selector: dict, labels: dict[str, str]) -> bool:
    """A LabelSelector as the API server reads it (matchLabels and matchExpressions)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions", []):
        present = e["key"] in labels
        ok = {
            "In": present and labels.get(e["key"]) in e.get("values", []),
            "NotIn": not present or labels[e["key"]] not in e.get("values", []),
            "Exists": present,
            "DoesNotExist": not present,
        }[e["operator"]]
        if not ok:
            return False
    return True


def admitted(rule: dict, labels: dict[str, str]) -> bool:
    """Whether a rule's peers admit a pod with `labels` in the policy's own namespace."""
    return any(
        "podSelector" in peer and "namespaceSelector" not in peer and matches(peer["podSelector"], labels)
        for peer in rule["from"]
    )


def container_ports(template: dict) -> set[str]:
    return {port["name"] for c in template["spec"]["containers"] for port in c.get("ports", [])}


def test_the_worker_policy_covers_every_worker_pod_of_the_model_and_no_other():
    spec = spec_with()
    policy = p.worker_network_policy(OWNER, spec)
    selector = policy["spec"]["podSelector"]
    chosen = {role for role, t in pods(OWNER, spec).items() if matches(selector, t["metadata"]["labels"])}
    assert chosen == {"worker-old", "worker-new"}
    assert not any(matches(selector, t["metadata"]["labels"]) for t in pods(OTHER, spec).values())
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open


def test_worker_grpc_and_data_only_from_this_models_gateway_and_rollout_jobs():
    spec = spec_with()
    serving, metrics = p.worker_network_policy(OWNER, spec)["spec"]["ingress"]
    assert [port["port"] for port in serving["ports"]] == ["grpc", "data"]
    ours = {role for role, t in pods(OWNER, spec).items() if admitted(serving, t["metadata"]["labels"])}
    assert ours == {"gateway", "prewarm", "smoke"}
    assert not any(admitted(serving, t["metadata"]["labels"]) for t in pods(OTHER, spec).values())
    # each peer picks out one kind of pod, by the labels the operator gives it
    for peer in serving["from"]:
        assert (
            len(
                [
                    r
                    for r, t in pods(OWNER, spec).items()
                    if matches(peer["podSelector"], t["metadata"]["labels"])
                ]
            )
            == 1
        )
    assert [port["port"] for port in metrics["ports"]] == ["metrics"]


def test_named_ports_exist_on_the_pods_they_open():
    spec = spec_with()
    templates = pods(OWNER, spec)
    worker_ports = {
        port["port"]
        for rule in p.worker_network_policy(OWNER, spec)["spec"]["ingress"]
        for port in rule["ports"]
    }
    assert worker_ports == {"grpc", "data", "metrics"}
    assert worker_ports <= container_ports(templates["worker-new"])
    gateway_ports = {
        port["port"]
        for rule in p.gateway_network_policy(OWNER, spec)["spec"]["ingress"]
        for port in rule["ports"]
    }
    assert gateway_ports == {"http"} <= container_ports(templates["gateway"])


def test_named_ports_hold_for_revisions_on_different_worker_ports():
    a, b = spec_with(), parse_spec(example("minilm-cpu.yaml")["spec"] | {"worker": {"port": 6000}})
    assert p.worker_network_policy(OWNER, a) == p.worker_network_policy(OWNER, b)


@pytest.mark.parametrize(
    "names,expected",
    [
        ([], [{"namespaceSelector": {}}]),
        (
            ["monitoring", "obs", "monitoring"],
            [
                {
                    "namespaceSelector": {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/metadata.name",
                                "operator": "In",
                                "values": ["monitoring", "obs"],
                            }
                        ]
                    }
                }
            ],
        ),
    ],
    ids=["every-namespace", "named"],
)
def test_worker_metrics_from_the_named_namespaces(names, expected):
    _, metrics = p.worker_network_policy(OWNER, spec_with(metricsNamespaces=names))["spec"]["ingress"]
    assert metrics["from"] == expected


@pytest.mark.parametrize(
    ("names", "expected"),
    [([], [{"namespaceSelector": {}}]), (["monitoring"], ["kembed-system", "monitoring"])],
    ids=["every-namespace", "named"],
)
def test_the_operator_namespace_may_read_worker_metrics_for_the_hot_list(names, expected):
    policy = p.worker_network_policy(OWNER, spec_with(metricsNamespaces=names), "kembed-system")
    _, metrics = policy["spec"]["ingress"]
    if names:
        ((peer,),) = [metrics["from"]]
        assert peer["namespaceSelector"]["matchExpressions"][0]["values"] == expected
    else:
        assert metrics["from"] == expected  # every namespace already: nothing to add
    gateway = p.gateway_network_policy(OWNER, spec_with(metricsNamespaces=names, gatewayFrom=GATEWAY_FROM))
    assert "kembed-system" not in str(gateway)  # the operator reads workers only


def test_the_gateway_takes_http_from_everyone_by_default():
    policy = p.gateway_network_policy(OWNER, spec_with())
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items()
        <= pods(OWNER, spec_with())["gateway"]["metadata"]["labels"].items()
    )
    (rule,) = policy["spec"]["ingress"]
    assert "from" not in rule and rule["ports"] == [{"protocol": "TCP", "port": "http"}]


GATEWAY_FROM = [
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}},
    {"podSelector": {"matchLabels": {"app": "search"}}},
    {
        "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["search"]}]},
        "podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
    },
    {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}},
]


def test_gateway_from_restricts_http_to_the_peers_given():
    (rule,) = p.gateway_network_policy(OWNER, spec_with(gatewayFrom=GATEWAY_FROM))["spec"]["ingress"]
    assert rule["from"] == GATEWAY_FROM


def test_a_restricted_gateway_still_lets_the_named_metrics_namespaces_scrape():
    spec = spec_with(gatewayFrom=GATEWAY_FROM[:1], metricsNamespaces=["monitoring"])
    (rule,) = p.gateway_network_policy(OWNER, spec)["spec"]["ingress"]
    assert rule["from"] == GATEWAY_FROM[:1] + p.metrics_peers(spec)


def test_disabled_renders_no_policy():
    assert p.network_policies(OWNER, spec_with(enabled=False)) == []
    assert [x["metadata"]["name"] for x in p.network_policies(OWNER, spec_with())] == [
        "model-worker",
        "model-gateway",
    ]


BAD_PEERS = {
    "ip-block-with-selector": {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}},
    "empty-peer": {},
    "in-without-values": {"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
    "exists-with-values": {
        "podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}
    },
    "bad-cidr": {"ipBlock": {"cidr": "10.0.0.300/8"}},
}


@pytest.mark.parametrize("bad", BAD_PEERS.values(), ids=BAD_PEERS.keys())
def test_bad_peers_are_refused_by_the_typed_spec(bad):
    with pytest.raises(pydantic.ValidationError):
        spec_with(gatewayFrom=[bad])


@pytest.mark.parametrize(
    "network_policy,expected",
    [
        ({"gatewayFrom": [{"ipBlock": {"cidr": "everywhere"}}]}, "does not match"),
        ({"metricsNamespaces": ["Monitoring"]}, "does not match"),
        (
            {"gatewayFrom": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}]},
            "is not one of",
        ),
        ({"enabled": "yes"}, "is not of type"),
    ],
    ids=["cidr", "namespace-name", "operator", "switch"],
)
def test_bad_network_policies_are_refused_by_the_crd_schema(network_policy, expected):
    body = {"apiVersion": "kembed.dev/v1alpha1", "kind": "EmbeddingModel", "metadata": {"name": "x"}}
    body["spec"] = example("minilm-cpu.yaml")["spec"] | {"networkPolicy": network_policy}
    found = [e.message for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(body)]
    assert any(expected in e for e in found), found


@pytest.mark.parametrize("version", ["1.31.0", "1.35.0"])
@pytest.mark.parametrize(
    "network_policy",
    [{}, {"gatewayFrom": GATEWAY_FROM, "metricsNamespaces": ["monitoring"]}],
    ids=["defaults", "everything-set"],
)
def test_every_variant_is_valid_kubernetes(network_policy, version):
    for doc in p.network_policies(OWNER, spec_with(**network_policy)):
        kubernetes_validate.validate(doc, version, strict=True)
