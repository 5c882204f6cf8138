"""worker.authTokenSecretRef: the Secret's key reaches the workers, the gateway and both rollout Jobs
as an environment variable (never in a ConfigMap or a command line), and it is part of the revision."""

from __future__ import annotations

import kubernetes_validate
import pytest
from operator_fakes import example

from kembed.operator.build import jobs as j
from kembed.operator.build import manifests as m
from kembed.operator.build.naming import Owner
from kembed.operator.build.revision import revision_of
from kembed.operator.spec.spec import parse_spec

IMAGE = "registry.test/kembed/worker:1"
OWNER = Owner("model", "ml", "0b8c1f8e-0000-4000-8000-000000000001")
REF = {"secretKeyRef": {"name": "worker-token", "key": "token"}}


def spec_with(ref: dict | None):
    body = example("minilm-cpu.yaml")["spec"]
    if ref is not None:
        body["worker"] = {**body.get("worker", {}), "authTokenSecretRef": ref}
    return parse_spec(body)


def env_of(obj: dict) -> dict[str, dict]:
    container = obj["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container["env"]}


def test_the_token_reaches_workers_gateway_and_jobs_from_its_secret():
    spec = spec_with({"name": "worker-token"})
    rev = revision_of(spec, IMAGE)
    targets = ("10.0.0.1:50051",)
    for obj, name in [
        (m.worker_deployment(OWNER, spec, rev, IMAGE), "KEMBED_WORKER_AUTH_TOKEN"),
        (m.gateway_deployment(OWNER, spec, rev, "gw:1"), "KEMBED_GATEWAY_WORKER_AUTH_TOKEN"),
        (
            j.job(OWNER, spec, j.JobRequest("prewarm", rev, 1, targets, targets), IMAGE),
            "KEMBED_WORKER_AUTH_TOKEN",
        ),
        (j.job(OWNER, spec, j.JobRequest("smoke", rev, 1, targets), IMAGE), "KEMBED_WORKER_AUTH_TOKEN"),
    ]:
        assert env_of(obj)[name] == {"name": name, "valueFrom": REF}
        assert "worker-token" not in str(obj["spec"]["template"]["spec"]["containers"][0].get("command"))
        kubernetes_validate.validate(obj, "1.31", strict=True)
    assert "KEMBED_WORKER_AUTH_TOKEN" not in str(m.engine_config_map(OWNER, spec, rev))


def test_without_a_token_nothing_changes_and_the_revision_is_the_old_one():
    plain = spec_with(None)
    assert not any("AUTH_TOKEN" in name for name in env_of(m.worker_deployment(OWNER, plain, "r", IMAGE)))
    with_token = spec_with({"name": "worker-token"})
    assert revision_of(with_token, IMAGE) != revision_of(plain, IMAGE)
    other = spec_with({"name": "worker-token", "key": "other"})
    assert revision_of(other, IMAGE) != revision_of(with_token, IMAGE)


def test_worker_probes_are_grpc_health_checks_on_the_grpc_port():
    spec = spec_with(None)
    container = m.worker_deployment(OWNER, spec, "r", IMAGE)["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": spec.worker.port}


@pytest.mark.parametrize(("seconds", "failures"), [(60, 6), (25, 3), (300, 30)])
def test_a_stalled_worker_is_restarted_after_stall_restart_seconds(seconds, failures):
    spec = spec_with(None).model_copy(
        update={"worker": spec_with(None).worker.model_copy(update={"stall_restart_seconds": seconds})}
    )
    container = m.worker_deployment(OWNER, spec, "r", IMAGE)["spec"]["template"]["spec"]["containers"][0]
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] == 10 * failures
    assert liveness["failureThreshold"] == failures


@pytest.mark.parametrize("bad", [{"name": ""}, {"key": "token"}], ids=["empty-name", "no-name"])
def test_a_reference_without_a_secret_name_is_refused(bad):
    with pytest.raises(Exception, match="name"):
        spec_with(bad)
