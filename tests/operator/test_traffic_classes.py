"""spec.trafficClasses: each field reaches the worker's ConfigMap or the gateway's environment under the
name the service reads, and means there what the spec says (read back through the services' own
parsers); the defaults are the services' defaults; out-of-range values are refused by the CRD schema and
by the typed spec; the workers' side rolls a new revision, the gateway's side only the gateway."""

from __future__ import annotations

import dataclasses

import jsonschema
import pydantic
import pytest
from operator_fakes import Driver, example

from kembed.gateway.__main__ import parse_config as parse_gateway_config
from kembed.gateway.config import GatewayConfig
from kembed.operator.build import manifests as m
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.crd import build_crd
from kembed.operator.spec.spec import parse_spec
from kembed.worker.__main__ import parse_config as parse_worker_config
from kembed.worker.config import WorkerConfig

IMAGE = "registry.test/kembed/worker:1"
OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
# The services' settings that trafficClasses feeds, by service.
WORKER_FIELDS = (
    "priority_classes",
    "bulk_queue_share",
    "bulk_step_tokens",
    "interactive_hold_s",
    "bulk_max_wait_s",
    "interactive_lane",
    "lane_inflight_batches",
)
GATEWAY_FIELDS = (
    "interactive_max_inputs",
    "interactive_max_tokens",
    "bulk_queue_share",
    "bulk_tokenization_processes",
)


def spec_with(**classes):
    body = example("minilm-cpu.yaml")["spec"]
    if classes:
        body["trafficClasses"] = classes
    return parse_spec(body)


def worker_env(spec) -> dict[str, str]:
    return m.engine_settings(spec, revision_of(spec, IMAGE))


def gateway_env(spec) -> dict[str, str]:
    return {e["name"]: e["value"] for e in m.gateway_env(OWNER, spec, "r") if "value" in e}


def parsed(service: str, spec) -> WorkerConfig | GatewayConfig:
    if service == "worker":
        return parse_worker_config([], worker_env(spec))
    return parse_gateway_config([], gateway_env(spec))


def test_defaults_render_the_services_defaults():
    spec = spec_with()
    worker, gateway = parsed("worker", spec), parsed("gateway", spec)
    worker_defaults = {f.name: f.default for f in dataclasses.fields(WorkerConfig)}
    gateway_defaults = {f.name: f.default for f in dataclasses.fields(GatewayConfig)}
    assert {name: getattr(worker, name) for name in WORKER_FIELDS} == {
        name: worker_defaults[name] for name in WORKER_FIELDS
    }
    assert {name: getattr(gateway, name) for name in GATEWAY_FIELDS} == {
        name: gateway_defaults[name] for name in GATEWAY_FIELDS
    }


# classes set -> (service, variable, its text, the service's config field, what it parses to)
RENDERED = {
    "classes-off": (
        {"enabled": False},
        ("worker", "KEMBED_WORKER_PRIORITY_CLASSES", "false", "priority_classes", False),
    ),
    "worker-share": (
        {"bulkQueueShare": 0.5},
        ("worker", "KEMBED_WORKER_BULK_QUEUE_SHARE", "0.5", "bulk_queue_share", 0.5),
    ),
    "bulk-step": (
        {"bulkStepTokens": 512},
        ("worker", "KEMBED_WORKER_BULK_STEP_TOKENS", "512", "bulk_step_tokens", 512),
    ),
    "hold": (
        {"interactiveHoldSeconds": 2.5},
        ("worker", "KEMBED_WORKER_INTERACTIVE_HOLD_S", "2.5", "interactive_hold_s", 2.5),
    ),
    "no-lane": (
        {"interactiveLane": False},
        ("worker", "KEMBED_WORKER_INTERACTIVE_LANE", "false", "interactive_lane", False),
    ),
    "one-lane-step": (
        {"laneInflightBatches": 1},
        ("worker", "KEMBED_WORKER_LANE_INFLIGHT_BATCHES", "1", "lane_inflight_batches", 1),
    ),
    "max-wait-zero": (
        {"bulkMaxWaitSeconds": 0},
        ("worker", "KEMBED_WORKER_BULK_MAX_WAIT_S", "0.0", "bulk_max_wait_s", 0.0),
    ),
    "gateway-share": (
        {"bulkQueueShare": 0.5},
        ("gateway", "KEMBED_GATEWAY_BULK_QUEUE_SHARE", "0.5", "bulk_queue_share", 0.5),
    ),
    "classes-off-admit-bulk-alike": (
        {"enabled": False, "bulkQueueShare": 0.5},
        ("gateway", "KEMBED_GATEWAY_PRIORITY_CLASSES", "false", "priority_classes", False),
    ),
    "inputs": (
        {"interactiveMaxInputs": 16},
        ("gateway", "KEMBED_GATEWAY_INTERACTIVE_MAX_INPUTS", "16", "interactive_max_inputs", 16),
    ),
    "tokens": (
        {"interactiveMaxTokens": 4096},
        ("gateway", "KEMBED_GATEWAY_INTERACTIVE_MAX_TOKENS", "4096", "interactive_max_tokens", 4096),
    ),
    "bulk-tokenization-processes": (
        {"bulkTokenizationProcesses": 2},
        ("gateway", "KEMBED_GATEWAY_BULK_TOKENIZATION_PROCESSES", "2", "bulk_tokenization_processes", 2),
    ),
}


@pytest.mark.parametrize(("classes", "expected"), RENDERED.values(), ids=RENDERED.keys())
def test_each_field_reaches_its_service_under_the_name_it_reads(classes, expected):
    service, name, text, field, value = expected
    spec = spec_with(**classes)
    env = worker_env(spec) if service == "worker" else gateway_env(spec)
    assert env[name] == text
    assert getattr(parsed(service, spec), field) == value


def test_bulk_tokenization_processes_are_rendered_only_when_set():
    """At 0 (or absent) the gateway's template is the one an operator without the field rendered, so
    upgrading the operator rolls no gateway; the gateway's own default is 0 too."""
    absent, zero = spec_with(), spec_with(bulkTokenizationProcesses=0)
    assert "KEMBED_GATEWAY_BULK_TOKENIZATION_PROCESSES" not in gateway_env(absent)
    assert m.gateway_deployment(OWNER, zero, "r", "gw") == m.gateway_deployment(OWNER, absent, "r", "gw")
    assert parsed("gateway", absent).bulk_tokenization_processes == 0


def test_the_lane_settings_at_their_defaults_render_no_variable():
    """So that the worker templates (and revisions) of models from before them stay as they were."""
    env = worker_env(spec_with(interactiveLane=True, laneInflightBatches=2))
    assert "KEMBED_WORKER_INTERACTIVE_LANE" not in env and "KEMBED_WORKER_LANE_INFLIGHT_BATCHES" not in env


def test_bulk_tokenization_processes_need_the_classes_on():
    """With the classes off no request is bulk, so the children would never work: refused by the typed
    spec and by a CEL rule on the section (the API server's), rather than rendered and ignored."""
    with pytest.raises(pydantic.ValidationError, match="bulkTokenizationProcesses needs enabled"):
        spec_with(enabled=False, bulkTokenizationProcesses=1)
    rules = SCHEMA["properties"]["spec"]["properties"]["trafficClasses"]["x-kubernetes-validations"]
    assert "self.enabled || self.bulkTokenizationProcesses == 0" in [r["rule"] for r in rules]
    assert spec_with(enabled=False, bulkTokenizationProcesses=0).traffic_classes.enabled is False


def test_the_workers_get_the_class_rule_from_their_revision_config_map_only():
    spec = spec_with(bulkStepTokens=512)
    rev = revision_of(spec, IMAGE)
    assert m.engine_config_map(OWNER, spec, rev)["data"]["KEMBED_WORKER_BULK_STEP_TOKENS"] == "512"
    container = m.worker_deployment(OWNER, spec, rev, IMAGE)["spec"]["template"]["spec"]["containers"][0]
    assert not any("BULK" in e["name"] or "INTERACTIVE" in e["name"] for e in container["env"])


BAD = {
    "share-zero": {"bulkQueueShare": 0},
    "share-below-a-tenth": {"bulkQueueShare": 0.05},
    "share-above-one": {"bulkQueueShare": 1.5},
    "negative-bulk-step": {"bulkStepTokens": -1},
    "fractional-bulk-step": {"bulkStepTokens": 100.5},
    "negative-hold": {"interactiveHoldSeconds": -0.1},
    "hold-in-milliseconds": {"interactiveHoldSeconds": 1000},
    "negative-max-wait": {"bulkMaxWaitSeconds": -1},
    "max-wait-over-a-minute": {"bulkMaxWaitSeconds": 61},
    "negative-inputs": {"interactiveMaxInputs": -1},
    "too-many-inputs": {"interactiveMaxInputs": 5000},
    "negative-tokens": {"interactiveMaxTokens": -1},
    "enabled-not-a-boolean": {"enabled": "maybe"},
    "negative-bulk-processes": {"bulkTokenizationProcesses": -1},
    "too-many-bulk-processes": {"bulkTokenizationProcesses": 17},
    "fractional-bulk-processes": {"bulkTokenizationProcesses": 1.5},
    "no-bulk-gateway-replica": {"bulkGateway": {"replicas": 0}},
    "too-many-bulk-gateway-replicas": {"bulkGateway": {"replicas": 65}},
    "bulk-gateway-not-an-object": {"bulkGateway": 2},
}


@pytest.mark.parametrize("classes", BAD.values(), ids=BAD.keys())
def test_out_of_range_values_are_refused_by_the_schema_and_the_typed_spec(classes):
    spec = {**example("minilm-cpu.yaml")["spec"], "trafficClasses": classes}
    body = {"apiVersion": "kembed.dev/v1alpha1", "kind": "EmbeddingModel", "metadata": {"name": "x"}}
    found = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(body | {"spec": spec}))
    assert [list(e.absolute_path)[:3] for e in found] == [["spec", "trafficClasses", next(iter(classes))]]
    with pytest.raises(pydantic.ValidationError, match=next(iter(classes))):
        parse_spec(spec)


def test_the_schema_describes_each_field_with_its_range_and_variable():
    fields = SCHEMA["properties"]["spec"]["properties"]["trafficClasses"]["properties"]
    assert set(fields) == {
        "enabled",
        "interactiveMaxInputs",
        "interactiveMaxTokens",
        "bulkQueueShare",
        "bulkStepTokens",
        "interactiveHoldSeconds",
        "bulkMaxWaitSeconds",
        "interactiveLane",
        "laneInflightBatches",
        "bulkTokenizationProcesses",
        "bulkGateway",
    }
    for name, field in fields.items():
        if field["type"] == "object":
            continue  # bulkGateway: objects of its own, not a variable (test_bulk_gateway.py)
        assert "KEMBED_" in field["description"], name  # where it goes, for `kubectl explain`
        if field["type"] != "boolean":
            assert "minimum" in field, name


def test_a_gateway_side_change_rolls_only_the_gateway():
    driver = Driver(example("minilm-cpu.yaml")["spec"])
    revision = driver.promote()
    (workers_before,) = driver.cluster.named("Deployment", "worker")
    driver.edit(
        "trafficClasses", interactiveMaxInputs=16, interactiveMaxTokens=4096, bulkTokenizationProcesses=1
    )
    status = driver.step()
    assert status["activeRevision"] == revision and status["rollout"] is None
    assert driver.cluster.named("Deployment", "worker") == [workers_before]
    (gateway,) = driver.cluster.named("Deployment", "gateway")
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KEMBED_GATEWAY_INTERACTIVE_MAX_INPUTS"] == "16"
    assert env["KEMBED_GATEWAY_INTERACTIVE_MAX_TOKENS"] == "4096"
    assert env["KEMBED_GATEWAY_BULK_TOKENIZATION_PROCESSES"] == "1"
    assert container["resources"]["requests"]["cpu"] == "2"  # its process and its child


def test_a_worker_side_change_is_a_rollout_and_the_gateway_switches_with_it():
    driver = Driver(example("minilm-cpu.yaml")["spec"])
    old = driver.promote()

    def gateway_share() -> str:
        (gateway,) = driver.cluster.named("Deployment", "gateway")
        env = gateway["spec"]["template"]["spec"]["containers"][0]["env"]
        return next(e["value"] for e in env if e["name"] == "KEMBED_GATEWAY_BULK_QUEUE_SHARE")

    driver.edit("trafficClasses", bulkQueueShare=0.5)
    new = driver.step()["candidateRevision"]
    assert new != old
    (config_map,) = driver.cluster.named("ConfigMap", "worker", new)
    assert config_map["data"]["KEMBED_WORKER_BULK_QUEUE_SHARE"] == "0.5"
    assert gateway_share() == "0.75"  # the gateway keeps the serving revision's share until promotion
    driver.pass_gates(new)
    assert gateway_share() == "0.5"  # switching to the new revision
    driver.cluster.roll_gateway()
    assert driver.step()["activeRevision"] == new
