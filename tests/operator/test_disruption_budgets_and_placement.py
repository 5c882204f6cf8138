"""Disruption budgets, topology spread, priority classes, grace periods and gateway processes: what the
operator renders by default and for each setting, that the budgets and spread constraints select
exactly the pods of the Deployment they guard, that the grace periods outlast the services' own
drains, and that every variant is valid Kubernetes (strict, 1.31 and 1.35)."""

from __future__ import annotations

import re

import kubernetes_validate
import pydantic
import pytest
from operator_fakes import REPO, example

from kembed.gateway.__main__ import parse_config as parse_gateway_config
from kembed.operator.build import manifests as m
from kembed.operator.build import placement
from kembed.operator.build import policies as p
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.spec.spec import parse_spec

IMAGE = "registry.test/kembed/worker:1"
OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")


def spec_with(worker: dict | None = None, gateway: dict | None = None, classes: dict | None = None):
    body = example("bge-m3-gpu.yaml")["spec"]
    body["worker"] = body.get("worker", {}) | (worker or {})
    body["gateway"] = body.get("gateway", {}) | (gateway or {})
    body["trafficClasses"] = body.get("trafficClasses", {}) | (classes or {})
    return parse_spec(body)


def rendered(spec) -> tuple[str, dict, dict, list[dict]]:
    """(revision, worker Deployment, gateway Deployment, budgets)."""
    rev = revision_of(spec, IMAGE)
    return (
        rev,
        m.worker_deployment(OWNER, spec, rev, IMAGE),
        m.gateway_deployment(OWNER, spec, rev, "gw"),
        p.disruption_budgets(OWNER, spec, [rev]),
    )


def pod_labels(deployment: dict) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def pod(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def selects(selector: dict, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


# --- disruption budgets -------------------------------------------------------------------------


def test_default_budgets_let_one_pod_go_at_a_time_and_never_wait_on_broken_pods():
    _, workers, gateway, budgets = rendered(spec_with())
    worker_budget, gateway_budget = budgets
    assert worker_budget["metadata"]["name"] == workers["metadata"]["name"]
    assert gateway_budget["metadata"]["name"] == gateway["metadata"]["name"]
    for budget, deployment in ((worker_budget, workers), (gateway_budget, gateway)):
        assert budget["spec"]["maxUnavailable"] == 1
        assert "minAvailable" not in budget["spec"]
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        # the budget guards exactly its Deployment's pods
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]
        assert selects(budget["spec"]["selector"], pod_labels(deployment))
    assert not selects(worker_budget["spec"]["selector"], pod_labels(gateway))
    assert not selects(gateway_budget["spec"]["selector"], pod_labels(workers))


def test_each_worker_revision_gets_its_own_budget():
    spec = spec_with()
    budgets = p.disruption_budgets(OWNER, spec, ["bbbb2222", "aaaa1111"])
    names = [b["metadata"]["name"] for b in budgets]
    assert names == ["model-worker-aaaa1111", "model-worker-bbbb2222", "model-gateway"]
    old = m.worker_deployment(OWNER, spec, "aaaa1111", IMAGE)
    assert selects(budgets[0]["spec"]["selector"], pod_labels(old))
    assert not selects(budgets[1]["spec"]["selector"], pod_labels(old))


BUDGETS = {
    "max-unavailable-percent": ({"maxUnavailable": "25%"}, {"maxUnavailable": "25%"}),
    "max-unavailable-zero": ({"maxUnavailable": 0}, {"maxUnavailable": 0}),
    "min-available-replaces-max": ({"minAvailable": 1}, {"minAvailable": 1}),
    "min-available-percent": ({"minAvailable": "50%", "maxUnavailable": 3}, {"minAvailable": "50%"}),
}


@pytest.mark.parametrize("component", ["worker", "gateway"])
@pytest.mark.parametrize("setting,expected", BUDGETS.values(), ids=BUDGETS.keys())
def test_budget_settings_are_rendered(component, setting, expected):
    spec = spec_with(**{component: {"disruptionBudget": setting}})
    (budget,) = [
        b for b in rendered(spec)[3] if b["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    limits = {k: v for k, v in budget["spec"].items() if k in ("maxUnavailable", "minAvailable")}
    assert limits == expected


@pytest.mark.parametrize("component", ["worker", "gateway"])
def test_a_disabled_budget_is_not_rendered(component):
    spec = spec_with(**{component: {"disruptionBudget": {"enabled": False}}})
    components = [b["metadata"]["labels"]["app.kubernetes.io/component"] for b in rendered(spec)[3]]
    assert components == [c for c in ("worker", "gateway") if c != component]


@pytest.mark.parametrize(
    "value", [-1, "1", "25", "a%", 1.5], ids=["negative", "digit-string", "no-percent", "letters", "float"]
)
def test_a_budget_that_is_neither_a_count_nor_a_percentage_is_refused(value):
    with pytest.raises(pydantic.ValidationError):
        spec_with(worker={"disruptionBudget": {"maxUnavailable": value}})


# --- topology spread and priority ---------------------------------------------------------------


def test_pods_spread_softly_over_nodes_and_zones_by_default():
    _, workers, gateway, _ = rendered(spec_with())
    for deployment in (workers, gateway):
        constraints = pod(deployment)["topologySpreadConstraints"]
        assert [(c["topologyKey"], c["whenUnsatisfiable"], c["maxSkew"]) for c in constraints] == [
            ("kubernetes.io/hostname", "ScheduleAnyway", 1),
            ("topology.kubernetes.io/zone", "ScheduleAnyway", 1),
        ]
        for constraint in constraints:
            # exactly the Deployment's pods: a revision's workers among themselves, the gateway's own
            assert constraint["labelSelector"] == deployment["spec"]["selector"]
            assert (constraint["nodeAffinityPolicy"], constraint["nodeTaintsPolicy"]) == ("Honor", "Honor")
    # the gateway's template changes in place: only pods of one template count
    assert all(
        c["matchLabelKeys"] == ["pod-template-hash"] for c in pod(gateway)["topologySpreadConstraints"]
    )
    assert all("matchLabelKeys" not in c for c in pod(workers)["topologySpreadConstraints"])
    assert "priorityClassName" not in pod(workers) and "priorityClassName" not in pod(gateway)


SPREADS = {
    "hard-nodes": (
        {"nodes": "DoNotSchedule", "maxSkew": 2},
        [
            ("kubernetes.io/hostname", "DoNotSchedule", 2),
            ("topology.kubernetes.io/zone", "ScheduleAnyway", 2),
        ],
    ),
    "zones-off": ({"zones": "Off"}, [("kubernetes.io/hostname", "ScheduleAnyway", 1)]),
    "hard-zones-only": (
        {"nodes": "Off", "zones": "DoNotSchedule"},
        [("topology.kubernetes.io/zone", "DoNotSchedule", 1)],
    ),
}


@pytest.mark.parametrize("component", ["worker", "gateway"])
@pytest.mark.parametrize("setting,expected", SPREADS.values(), ids=SPREADS.keys())
def test_spread_settings_are_rendered(component, setting, expected):
    _, workers, gateway, _ = rendered(spec_with(**{component: {"topologySpread": setting}}))
    deployment = workers if component == "worker" else gateway
    constraints = pod(deployment)["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["whenUnsatisfiable"], c["maxSkew"]) for c in constraints] == expected


@pytest.mark.parametrize("component", ["worker", "gateway"])
def test_no_spread_renders_no_constraints(component):
    _, workers, gateway, _ = rendered(
        spec_with(**{component: {"topologySpread": {"nodes": "Off", "zones": "Off"}}})
    )
    assert "topologySpreadConstraints" not in pod(workers if component == "worker" else gateway)


@pytest.mark.parametrize("component", ["worker", "gateway"])
def test_a_priority_class_reaches_the_pods(component):
    _, workers, gateway, _ = rendered(spec_with(**{component: {"priorityClassName": "kembed-serving"}}))
    assert pod(workers if component == "worker" else gateway)["priorityClassName"] == "kembed-serving"


@pytest.mark.parametrize("name", ["Serving", "-x", "a_b"], ids=["upper-case", "leading-dash", "underscore"])
def test_a_priority_class_that_is_no_dns_name_is_refused(name):
    with pytest.raises(pydantic.ValidationError):
        spec_with(gateway={"priorityClassName": name})


# --- graceful termination -----------------------------------------------------------------------


def test_worker_grace_outlasts_the_workers_own_drain():
    """The worker's SIGTERM path (worker/__main__.py) drains streams, then stops the gRPC server, each
    with its own bound; the pod's grace period must exceed both together."""
    source = (REPO / "worker" / "__main__.py").read_text()
    (drain_s,) = map(int, re.findall(r"service\.drain\(timeout_s=(\d+)\)", source))
    (stop_s,) = map(int, re.findall(r"server\.stop\(grace=(\d+)\)", source))
    assert drain_s + stop_s == placement.WORKER_DRAIN_S
    _, workers, _, _ = rendered(spec_with())
    assert pod(workers)["terminationGracePeriodSeconds"] > drain_s + stop_s
    assert "lifecycle" not in pod(workers)["containers"][0]  # nothing to wait for before SIGTERM


@pytest.mark.parametrize("timeout_s", [0.5, 60, 600.5])
def test_gateway_grace_outlasts_its_pre_stop_and_its_longest_request(timeout_s):
    _, _, gateway, _ = rendered(spec_with(gateway={"requestTimeoutSeconds": timeout_s}))
    container = pod(gateway)["containers"][0]
    pre_stop_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod(gateway)["terminationGracePeriodSeconds"] > pre_stop_s + timeout_s


# --- gateway processes --------------------------------------------------------------------------


@pytest.mark.parametrize("processes", [1, 4])
def test_gateway_processes_reach_the_gateway_config(processes):
    spec = spec_with(gateway={"processes": processes})
    env = {e["name"]: e["value"] for e in m.gateway_env(OWNER, spec, "r") if "value" in e}
    assert parse_gateway_config([], env).processes == processes


CPU = {
    "default-one-process": (1, None, "1"),
    "raised-to-processes": (4, "1", "4"),
    "millicores-raised": (2, "500m", "2"),
    "more-kept": (2, "3", "3"),
    "millicores-kept": (2, "2500m", "2500m"),
    "none-set": (3, "", "3"),
}


@pytest.mark.parametrize("processes,cpu,expected", CPU.values(), ids=CPU.keys())
def test_the_gateway_requests_a_core_per_process(processes, cpu, expected):
    gateway: dict = {"processes": processes}
    if cpu is not None:
        requests = {"cpu": cpu, "memory": "1Gi"} if cpu else {"memory": "1Gi"}
        gateway["resources"] = {"requests": requests, "limits": {"memory": "2Gi"}}
    _, _, deployment, _ = rendered(spec_with(gateway=gateway))
    resources = pod(deployment)["containers"][0]["resources"]
    assert resources["requests"]["cpu"] == expected
    assert resources["requests"]["memory"] == "1Gi" and resources["limits"] == {"memory": "2Gi"}


# processes, bulk tokenization children of each, cpu request -> rendered
BULK_CPU = {
    "none": (1, 0, "1", "1"),
    "one-child": (1, 1, "1", "2"),
    "a-child-per-process": (2, 1, "500m", "4"),
    "two-each": (3, 2, "", "9"),
    "more-kept": (1, 2, "4", "4"),
}


@pytest.mark.parametrize("processes,children,cpu,expected", BULK_CPU.values(), ids=BULK_CPU.keys())
def test_the_gateway_requests_a_core_per_bulk_tokenization_process_too(processes, children, cpu, expected):
    requests = {"cpu": cpu, "memory": "1Gi"} if cpu else {"memory": "1Gi"}
    gateway = {"processes": processes, "resources": {"requests": requests, "limits": {"memory": "2Gi"}}}
    spec = spec_with(gateway=gateway, classes={"bulkTokenizationProcesses": children})
    _, _, deployment, _ = rendered(spec)
    assert pod(deployment)["containers"][0]["resources"]["requests"]["cpu"] == expected
    assert placement.gateway_cores(spec.gateway, spec.traffic_classes) == processes * (1 + children)


# --- valid Kubernetes ---------------------------------------------------------------------------

EVERYTHING = {
    "priorityClassName": "kembed-serving",
    "topologySpread": {"nodes": "DoNotSchedule", "zones": "ScheduleAnyway", "maxSkew": 2},
    "disruptionBudget": {"minAvailable": "50%"},
}


@pytest.mark.parametrize("version", ["1.31.0", "1.35.0"])
@pytest.mark.parametrize(
    "worker,gateway",
    [
        ({}, {}),
        (EVERYTHING, EVERYTHING | {"processes": 4}),
        ({"topologySpread": {"nodes": "Off", "zones": "Off"}}, {}),
    ],
    ids=["defaults", "everything-set", "no-spread"],
)
def test_every_variant_is_valid_kubernetes(worker, gateway, version):
    classes = {"bulkTokenizationProcesses": 2} if "processes" in gateway else {}
    _, workers, deployment, budgets = rendered(spec_with(worker=worker, gateway=gateway, classes=classes))
    for doc in (workers, deployment, *budgets):
        kubernetes_validate.validate(doc, version, strict=True)
