"""Every KEMBED_* variable the operator renders for a worker pod is one the worker reads, documented
in `kembed-worker --help`; the rollout Jobs' commands parse with the worker image's own tools."""

from __future__ import annotations

import pytest
from operator_fakes import example

from kembed.operator.build import jobs as j
from kembed.operator.build import manifests as m
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.spec.spec import parse_spec
from kembed.worker.cli import build_parser, env_name, parse_config
from kembed.worker.config import WorkerConfig
from kembed.worker.tools import admin

IMAGE = "registry.test/kembed/worker:1"
OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")
WORKER_VARIABLES = {env_name(field) for field in WorkerConfig.__dataclass_fields__}


def everything_set():
    """The GPU example with every optional worker setting the operator may render."""
    body = example("bge-m3-gpu.yaml")["spec"]
    body["model"] |= {"pooling": "cls", "normalize": False}
    body["worker"] |= {"authTokenSecretRef": {"name": "worker-token"}}
    body["rollout"] |= {"smokeBuckets": ["1x64"]}
    return parse_spec(body)


def rendered_variables(spec) -> dict[str, str]:
    """The worker container's KEMBED_* variables: its ConfigMap's and its own (a Secret's: no value)."""
    rev = revision_of(spec, IMAGE)
    container = m.worker_deployment(OWNER, spec, rev, IMAGE)["spec"]["template"]["spec"]["containers"][0]
    variables = dict(m.engine_settings(spec, rev))
    variables |= {e["name"]: e.get("value", "") for e in container["env"]}
    return {name: value for name, value in variables.items() if name.startswith("KEMBED_")}


@pytest.mark.parametrize("name", ["minilm-cpu.yaml", "bge-m3-gpu.yaml", "everything-set"])
def test_every_rendered_variable_is_a_documented_worker_setting(name):
    spec = everything_set() if name == "everything-set" else parse_spec(example(name)["spec"])
    rendered = rendered_variables(spec)
    assert set(rendered) <= WORKER_VARIABLES, set(rendered) - WORKER_VARIABLES
    help_text = " ".join(build_parser({}).format_help().split())
    for variable in rendered:
        assert f"[env {variable}" in help_text
    config = parse_config([], {k: v for k, v in rendered.items() if v})  # the Secret's value is not here
    assert config.revision == rendered["KEMBED_REVISION"]


def test_everything_set_renders_the_optional_variables_too():
    assert {"KEMBED_WORKER_POOLING", "KEMBED_WORKER_NORMALIZE", "KEMBED_WORKER_AUTH_TOKEN"} <= set(
        rendered_variables(everything_set())
    )


@pytest.mark.parametrize("kind", ["prewarm", "smoke"])
def test_the_rollout_jobs_commands_parse_with_the_worker_tools(kind):
    spec = everything_set()
    rev = revision_of(spec, IMAGE)
    targets = ("10.0.0.1:50051", "10.0.0.2:50051")
    command = j.command(spec, j.JobRequest(kind, rev, 1, targets, targets))
    assert command[:2] == ["kembed-worker", kind]
    args = admin.parse_args(command[1:])
    assert (args.command, args.target) == (kind, list(targets))
