"""Scale from zero with the real operator, gateway and worker on the API stand-in: a model with
`autoscaling.scaleToZero` whose workers are scaled to zero keeps a ready gateway that holds its
requests; the held requests show in `kembed_gateway_held_requests`, the signal of the ScaledObject's
`held-requests` trigger; when that signal scales the worker Deployment 0 -> 1 (KEDA's step, played
here: the stand-in runs no KEDA), every held request is answered by the new worker, none lost."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from operator_cluster import gateway_url, start_ready

pytestmark = pytest.mark.slow

DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
NUM_HELD = 6


def gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} not in the gateway's /metrics"
    return float(found.group(1))


def held_requests(url: str) -> float:
    """What the `held-requests` trigger's query sums for this gateway pod."""
    return gauge(url, "kembed_gateway_held_requests")


def scale(cluster, deployment: str, replicas: int) -> None:
    """What KEDA does to the worker Deployment it scales (the operator leaves `replicas` to it)."""
    answer = cluster.api.patch(
        f"{DEPLOYMENTS}/{deployment}",
        json={"spec": {"replicas": replicas}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    answer.raise_for_status()


def test_requests_at_zero_workers_are_held_and_answered_after_the_wake_up(cluster, example):
    example["spec"]["autoscaling"] = {
        "enabled": True,
        "minReplicas": 0,
        "scaleToZero": True,
        "prometheusAddress": "http://prometheus.monitoring.svc:9090",
        "maxHeldRequests": NUM_HELD,
    }
    revision = start_ready(cluster, example)
    workers = f"minilm-worker-{revision}"
    url = gateway_url(cluster)
    scale(cluster, workers, 0)
    cluster.wait("no worker pod", lambda: not cluster.kubelet.pods_of(workers), timeout_s=60)
    cluster.wait(
        "the gateway without a serving worker",
        lambda: gauge(url, "kembed_gateway_serving_workers") == 0,
        timeout_s=30,
    )
    assert httpx.get(f"{url}/ready", timeout=5).status_code == 200  # its Service keeps it at zero
    texts = [f"query {i} after a quiet hour" for i in range(NUM_HELD)]
    with ThreadPoolExecutor(NUM_HELD) as pool:
        sent = [
            pool.submit(httpx.post, f"{url}/v1/embeddings", json={"input": text}, timeout=180)
            for text in texts
        ]
        cluster.wait("every request held", lambda: held_requests(url) == NUM_HELD, timeout_s=30)
        assert not any(f.done() for f in sent)
        woken_at = time.monotonic()
        scale(cluster, workers, 1)  # the trigger's value, 1 (> bool 0), asks for one pod
        answers = [f.result(timeout=180) for f in sent]
    waited = time.monotonic() - woken_at
    assert [a.status_code for a in answers] == [200] * NUM_HELD, [a.text for a in answers]
    assert all(len(a.json()["data"][0]["embedding"]) == 384 for a in answers)
    assert held_requests(url) == 0
    print(f"{NUM_HELD} requests held at zero workers, all answered {waited:.1f} s after the wake-up")
