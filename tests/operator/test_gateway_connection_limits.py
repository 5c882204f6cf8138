"""spec.gateway.connections: each limit reaches the gateway's environment under the name the gateway
reads and means there what the spec says (read back through the gateway's own parser); unset, nothing
is rendered and the gateway keeps its own default, so a model without them keeps its gateway template;
out-of-range values are refused by the CRD schema and by the typed spec; none is part of the revision."""

from __future__ import annotations

import dataclasses

import jsonschema
import pydantic
import pytest
from operator_fakes import example

from kembed.gateway.__main__ import parse_config as parse_gateway_config
from kembed.gateway.config import GatewayConfig
from kembed.operator.build import manifests as m
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.crd import build_crd
from kembed.operator.spec.edge_spec import CONNECTION_VARIABLES
from kembed.operator.spec.spec import parse_spec

OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")
SCHEMA = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
IMAGE = "registry.test/kembed/worker:1"

# spec field -> (value, the gateway's GatewayConfig field, what it parses to)
SET = {
    "maxConnections": (20000, "max_connections", 20000),
    "headerTimeoutSeconds": (5, "header_timeout_s", 5.0),
    "bodyTimeoutSeconds": (300, "body_timeout_s", 300.0),
    "keepAliveTimeoutSeconds": (650, "keep_alive_timeout_s", 650.0),
}


def spec_with(**connections):
    body = example("minilm-cpu.yaml")["spec"]
    if connections:
        body.setdefault("gateway", {})["connections"] = connections
    return parse_spec(body)


def gateway_env(spec) -> dict[str, str]:
    return {e["name"]: e["value"] for e in m.gateway_env(OWNER, spec, "r") if "value" in e}


def parsed(spec) -> GatewayConfig:
    return parse_gateway_config([], gateway_env(spec))


@pytest.mark.parametrize("field", SET)
def test_each_limit_reaches_the_gateway_under_the_name_it_reads(field):
    value, config_field, want = SET[field]
    spec = spec_with(**{field: value})
    assert getattr(parsed(spec), config_field) == want
    assert set(gateway_env(spec)) - set(gateway_env(spec_with())) == {
        next(v for f, v in CONNECTION_VARIABLES.items() if getattr(spec.gateway.connections, f) is not None)
    }


def test_unset_limits_render_nothing_and_keep_the_gateways_defaults():
    absent = spec_with()
    empty_body = example("minilm-cpu.yaml")["spec"]
    empty_body.setdefault("gateway", {})["connections"] = {}
    empty = parse_spec(empty_body)
    assert not set(CONNECTION_VARIABLES.values()) & set(gateway_env(absent))
    assert m.gateway_deployment(OWNER, empty, "r", "gw") == m.gateway_deployment(OWNER, absent, "r", "gw")
    defaults = {f.name: f.default for f in dataclasses.fields(GatewayConfig)}
    gateway = parsed(absent)
    assert all(getattr(gateway, field) == defaults[field] for _, field, _ in SET.values())


def test_no_limit_is_part_of_the_revision():
    every = spec_with(**{field: value for field, (value, _, _) in SET.items()})
    assert revision_of(every, IMAGE) == revision_of(spec_with(), IMAGE)


@pytest.mark.parametrize(
    "connections",
    [
        {"maxConnections": 0},
        {"headerTimeoutSeconds": 0},
        {"bodyTimeoutSeconds": 3601},
        {"keepAliveTimeoutSeconds": -1},
    ],
    ids=str,
)
def test_out_of_range_limits_are_refused_by_the_schema_and_the_typed_spec(connections):
    spec = example("minilm-cpu.yaml")["spec"]
    spec.setdefault("gateway", {})["connections"] = connections
    body = {"apiVersion": "kembed.dev/v1alpha1", "kind": "EmbeddingModel", "metadata": {"name": "x"}}
    found = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(body | {"spec": spec}))
    field = next(iter(connections))
    assert [list(e.absolute_path)[:4] for e in found] == [["spec", "gateway", "connections", field]]
    with pytest.raises(pydantic.ValidationError, match=field):
        parse_spec(spec)


def test_the_schema_describes_each_limit_with_its_default_and_variable():
    fields = SCHEMA["properties"]["spec"]["properties"]["gateway"]["properties"]["connections"]["properties"]
    assert set(fields) == set(SET)
    for name, variable in zip(SET, CONNECTION_VARIABLES.values(), strict=True):
        assert variable in fields[name]["description"] and "default" in fields[name]["description"]
        assert "minimum" in fields[name] and "maximum" in fields[name]
