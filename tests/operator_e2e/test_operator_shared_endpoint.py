"""Two EmbeddingModels naming one `spec.endpoint`, with the real operator, gateway and workers on
the API stand-in: each is rolled out through its own gate, one gateway pod (the endpoint's) serves
both, each request reaching the workers of the model it names, an unknown model its API's 404; a
rollout of one model refuses none of the other's requests."""

from __future__ import annotations

import copy
import threading
import time

import httpx
import pytest
from operator_cluster import MODELS, apply, condition, patch_spec

pytestmark = pytest.mark.slow

ENDPOINT = "search"


def ready(cluster, name: str) -> bool:
    model = cluster.api.get(f"{MODELS}/{name}").json()
    return (model.get("status") or {}).get("phase") == "Ready" and condition(model, "Ready")[
        "status"
    ] == "True"


def start_both(cluster, example) -> None:
    """minilm and e5 (another revision of the same weights) behind the endpoint, both Ready."""
    first = copy.deepcopy(example)
    first["spec"]["endpoint"] = ENDPOINT
    second = copy.deepcopy(first)
    second["metadata"]["name"] = "e5"
    second["spec"]["model"]["servedName"] = "e5"
    second["spec"]["worker"]["maxBatchTokens"] = 1024  # a revision of its own
    apply(cluster, first)
    apply(cluster, second)
    for name in ("minilm", "e5"):
        cluster.wait(f"{name} Ready", lambda name=name: ready(cluster, name), timeout_s=240)


def test_two_models_are_served_by_one_endpoint_gateway(cluster, example):
    start_both(cluster, example)
    (pod,) = cluster.wait(
        "one endpoint gateway pod",
        lambda: pods if len(pods := cluster.kubelet.pods_of("search-endpoint")) == 1 else None,
        timeout_s=60,
    )
    assert cluster.kubelet.pods_of("minilm-gateway") == cluster.kubelet.pods_of("e5-gateway") == []
    url = f"http://{pod.ip}:8080"
    cluster.wait(
        "the endpoint serving both",
        lambda: httpx.get(f"{url}/ready", timeout=5).status_code == 200,
        timeout_s=60,
    )
    names = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=5).json()["data"]]
    assert names == ["e5", "sentence-transformers/all-MiniLM-L6-v2"]  # the first by model name: e5
    workers = {}
    for name in names:
        response = httpx.post(f"{url}/v1/embeddings", json={"input": "hello", "model": name}, timeout=60)
        assert response.status_code == 200 and response.json()["model"] == name, response.text
        info = httpx.get(f"{url}/info", headers={"X-Kembed-Model": name}, timeout=5).json()
        workers[name] = {w["address"] for w in info["workers"] if w["serving"]}
    assert all(workers.values()) and workers["e5"].isdisjoint(workers[names[1]])  # each its own
    unknown = httpx.post(f"{url}/v1/embeddings", json={"input": "hello", "model": "nope"}, timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    statuses = [cluster.api.get(f"{MODELS}/{n}").json()["status"]["gatewayURL"] for n in ("minilm", "e5")]
    assert statuses == ["http://search-endpoint.default.svc"] * 2


def test_a_rollout_of_one_model_refuses_none_of_the_others_requests(cluster, example):
    start_both(cluster, example)
    old = cluster.api.get(f"{MODELS}/minilm").json()["status"]["activeRevision"]
    (before,) = cluster.kubelet.pods_of("search-endpoint")
    answers: list[int] = []
    done = threading.Event()

    def post_to_e5() -> None:
        """To the newest ready endpoint pod, as a Service would send (a pod going away is passed over)."""
        while not done.is_set():
            pods = [p for p in cluster.kubelet.pods_of("search-endpoint") if p.is_ready]
            try:
                body = {"input": "hello", "model": "e5"}
                answers.append(
                    httpx.post(f"http://{pods[-1].ip}:8080/v1/embeddings", json=body, timeout=10).status_code
                )
            except (httpx.HTTPError, IndexError):
                continue
            time.sleep(0.05)

    client = threading.Thread(target=post_to_e5)
    client.start()
    try:
        patch_spec(cluster, {"worker": {"maxBatchSequences": 64}})  # minilm's, a new revision
        cluster.wait("minilm on its new revision", lambda: rolled(cluster, old), timeout_s=240)
        time.sleep(5)  # past the old endpoint pod's drain
    finally:
        done.set()
        client.join(30)
    assert answers and set(answers) == {200}, f"{len(answers)} answers: {sorted(set(answers))}"
    (after,) = [p for p in cluster.kubelet.pods_of("search-endpoint") if p.is_ready]
    assert after.name != before.name  # the endpoint's pod was rolled onto minilm's new revision
    assert ready(cluster, "e5")


def rolled(cluster, old: str) -> bool:
    status = cluster.api.get(f"{MODELS}/minilm").json().get("status") or {}
    return status.get("activeRevision") not in (None, old) and ready(cluster, "minilm")
