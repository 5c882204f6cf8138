"""A worker pod given a GPU runs with --device cuda, `device: auto` included: a pod whose torch sees
no CUDA device (a driver mismatch) then fails to start, and so its rollout's gate, instead of
passing the smoke test on the CPU path and serving on the CPU while it holds a GPU."""

import pytest
from operator_fakes import example

from kembed.operator.build import manifests as m
from kembed.operator.spec.spec import parse_spec


def spec(device: str, limits: dict[str, str]):
    body = example("minilm-cpu.yaml")["spec"]
    body["worker"] |= {"device": device, "resources": {"limits": limits}}
    return parse_spec(body)


@pytest.mark.parametrize(
    ("device", "limits", "rendered"),
    [
        ("auto", {"nvidia.com/gpu": "1"}, "cuda"),
        ("auto", {"nvidia.com/mig-1g.10gb": "1"}, "cuda"),
        ("auto", {"memory": "8Gi"}, "auto"),
        ("cuda", {"nvidia.com/gpu": "1"}, "cuda"),
        ("cpu", {"memory": "8Gi"}, "cpu"),
    ],
    ids=["auto-gpu", "auto-mig", "auto-no-gpu", "cuda", "cpu"],
)
def test_the_worker_device_follows_the_gpu_it_is_given(device, limits, rendered):
    settings = m.engine_settings(spec(device, limits), "r")
    assert settings["KEMBED_WORKER_DEVICE"] == rendered
