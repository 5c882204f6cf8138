"""spec.model.linearDtype: the opt-in fp8 linears reach the workers only when asked for, are part of
the revision then (and only then), and are refused where the worker would refuse them."""

from __future__ import annotations

import copy

import pydantic
import pytest
from operator_fakes import example

from kembed.operator.build import manifests as m
from kembed.operator.build.revision import revision_of
from kembed.operator.spec.spec import parse_spec
from kembed.worker.__main__ import parse_config as parse_worker_config

IMAGE = "registry.test/kembed/worker:1"


def gpu_spec(**model) -> dict:
    body = copy.deepcopy(example("bge-m3-gpu.yaml")["spec"])
    body["model"].update(model)
    return body


def worker_env(body: dict) -> dict[str, str]:
    spec = parse_spec(body)
    return m.engine_settings(spec, revision_of(spec, IMAGE))


def test_the_default_sets_nothing_and_keeps_the_revision():
    body = gpu_spec()
    assert "KEMBED_WORKER_LINEAR_DTYPE" not in worker_env(body)
    # and the revision is the one from before the field existed: test_manifests_golden holds it
    assert parse_worker_config([], worker_env(body)).linear_dtype == "auto"


def test_fp8_reaches_the_worker_and_is_a_new_revision():
    env = worker_env(gpu_spec(linearDtype="fp8"))
    assert env["KEMBED_WORKER_LINEAR_DTYPE"] == "fp8"
    assert parse_worker_config([], env).linear_dtype == "fp8"
    fp8, auto = parse_spec(gpu_spec(linearDtype="fp8")), parse_spec(gpu_spec())
    assert revision_of(fp8, IMAGE) != revision_of(auto, IMAGE)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"model": {"dtype": "float32"}}, "dtype float32"),
        ({"worker": {"device": "cpu"}}, "worker.device must not be cpu"),
    ],
    ids=["float32", "cpu"],
)
def test_fp8_where_the_worker_cannot_run_it_is_refused(change, words):
    body = gpu_spec(linearDtype="fp8")
    for part, fields in change.items():
        body[part].update(fields)
    with pytest.raises(pydantic.ValidationError, match=words):
        parse_spec(body)


def test_an_unknown_linear_dtype_is_refused():
    with pytest.raises(pydantic.ValidationError, match="linearDtype"):
        parse_spec(gpu_spec(linearDtype="int8"))
