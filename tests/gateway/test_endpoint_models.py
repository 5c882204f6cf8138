"""`--models` (KEMBED_GATEWAY_MODELS) reads into one config per model: the gateway's own with the
model's entry laid over it; what is wrong is refused at start, naming the entry; no list is the
one-model gateway exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kembed.gateway.__main__ import parse_config
from kembed.gateway.config import GatewayConfig
from kembed.gateway.endpoint import model_configs


def models_flag(*entries: dict) -> list[str]:
    return ["--models", json.dumps(list(entries))]


def test_no_models_list_is_the_one_model_gateway(tmp_path: Path):
    config = parse_config(["--model", str(tmp_path)], {})
    assert model_configs(config) == (config,)


def test_each_model_is_the_gateways_config_with_its_entry_over_it(tmp_path: Path):
    config = parse_config(
        [
            "--chunk-tokens", "1024", "--port", "9000",
            *models_flag(
                {"model_dir": str(tmp_path / "bge-m3"), "worker_service": "bge:50051", "max_seq_length": 512},
                {"model_dir": str(tmp_path / "e5"), "name": "e5-large", "worker_addresses": ["h:1", "h:2"],
                 "chunk_tokens": 2048, "wake_timeout_s": 30, "max_held_requests": 8},
            ),
        ],
        {},
    )  # fmt: skip
    bge, e5 = model_configs(config)
    assert (bge.served_model_names, bge.model_dir, bge.worker_services) == (
        ("bge-m3",), tmp_path / "bge-m3", ("bge:50051",),
    )  # fmt: skip
    assert (bge.max_seq_length, bge.chunk_tokens, bge.port) == (512, 1024, 9000)
    assert (e5.served_model_names, e5.static_workers, e5.chunk_tokens) == (
        ("e5-large",),
        ("h:1", "h:2"),
        2048,
    )
    assert (e5.wake_timeout_s, e5.max_held_requests) == (30.0, 8)
    assert bge.models == e5.models == ""


def test_the_default_model_comes_first(tmp_path: Path):
    flags = models_flag(
        {"model_dir": str(tmp_path / "a"), "worker_addresses": ["h:1"]},
        {"model_dir": str(tmp_path / "b"), "worker_addresses": ["h:2"]},
    )
    config = parse_config([*flags, "--default-model", "b"], {})
    assert [c.served_model_names[0] for c in model_configs(config)] == ["b", "a"]


A = {"model_dir": "a", "worker_addresses": ["h:1"]}


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ([{"worker_addresses": ["h:1"]}], "models[0] has no model_dir"),
        ([{"model_dir": "a"}], "models[0] names no workers"),
        ([A | {"port": 1}], "port is the endpoint's"),
        ([A | {"chunk_token": 1}], "unknown field 'chunk_token'"),
        ([A | {"chunk_tokens": "nine"}], "chunk_tokens must be a int"),
        ([A | {"chunk_tokens": [9]}], "chunk_tokens must be a int"),
        ([A | {"model_dir": "x/a"}, A | {"model_dir": "y/a"}], "two models are named a"),
        ({"model_dir": "a"}, "non-empty JSON list"),
    ],
    ids=[
        "no-dir", "no-workers", "edge-field", "unknown-field", "not-a-number", "wrong-type", "same-name",
        "not-a-list",
    ],
)  # fmt: skip
def test_a_wrong_models_list_is_refused_naming_the_entry(entries, error):
    with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("]", r"\]")):
        parse_config(["--models", json.dumps(entries)], {})


def test_an_unknown_default_model_is_refused(tmp_path: Path):
    flags = models_flag({"model_dir": str(tmp_path / "a"), "worker_addresses": ["h:1"]})
    with pytest.raises(ValueError, match="default_model 'b' is none of the models' names: a"):
        parse_config([*flags, "--default-model", "b"], {})


def test_several_models_run_in_one_process(tmp_path: Path):
    models = json.dumps([{"model_dir": str(tmp_path), "worker_addresses": ["h:1"]}])
    with pytest.raises(ValueError, match="set processes to 1"):
        model_configs(GatewayConfig(model_dir=Path(), models=models, processes=2))


def test_the_list_comes_from_the_environment_too(tmp_path: Path):
    models = json.dumps([{"model_dir": str(tmp_path / "m"), "worker_addresses": ["h:1"]}])
    (only,) = model_configs(parse_config([], {"KEMBED_GATEWAY_MODELS": models}))
    assert only.served_model_names == ("m",)


def test_a_models_settings_may_be_strings_as_the_environment_gives_them(tmp_path: Path):
    """The operator writes each model's settings from its gateway's variables (KEMBED_GATEWAY_*)."""
    entry = {"model_dir": str(tmp_path / "m"), "worker_service": "w:1", "chunk_tokens": "2048",
             "auto_truncate": "false", "request_timeout_s": "5.5", "prompts": '{"query": "q: "}'}  # fmt: skip
    (only,) = model_configs(parse_config(models_flag(entry), {}))
    assert (only.chunk_tokens, only.auto_truncate, only.request_timeout_s) == (2048, False, 5.5)
    assert only.prompts == '{"query": "q: "}'
