"""A model from a Hugging Face Hub source, end to end on the stand-in cluster: the real operator runs
the resolve Job (the real `fetch-model --resolve-only` against a local Hub endpoint serving the bundled
all-MiniLM-L6-v2, tests/worker/fake_hub.py), the local kubelet runs each pod's real fetch init
container before the real worker and gateway start, and the gateway answers with the bundled model's
embeddings. A repository the Hub lacks is ModelFetchFailed, naming it, within seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from operator_cluster import MODEL_NAME, apply, condition, gateway_url, is_ready

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from fake_hub import Commit, FakeHub, FakeRepo, files_of

from kembed.worker.config import bundled_model_dir

pytestmark = pytest.mark.slow
SHA = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
TEXTS = ["hello kubernetes", "a model fetched from the hub, verified, then served"]


@pytest.fixture
def hub():
    bundled = bundled_model_dir()
    repo = FakeRepo([Commit(SHA, files_of(bundled))], {"main": SHA})
    fake = FakeHub({MODEL_NAME: repo})
    server, url = fake.serve()
    yield fake, url
    server.shutdown()
    server.server_close()


def hub_model(example: dict, url: str, repo: str = MODEL_NAME) -> dict:
    example["spec"]["model"]["source"] = {"huggingFace": {"repo": repo, "endpoint": url}}
    return example


def test_a_hub_model_is_fetched_before_the_worker_starts_and_serves_the_same_embeddings(
    cluster, example, hub
):
    fake, url = hub
    apply(cluster, hub_model(example, url))
    cluster.wait("phase Ready", lambda: is_ready(cluster), timeout_s=180)
    status = cluster.model()["status"]
    assert status["model"]["resolved"] == SHA and status["model"]["serving"] == SHA
    fetched = {
        (owner.split("-")[1], code)
        for owner, name, code in cluster.kubelet.init_runs
        if name == "fetch-model"
    }
    assert {("worker", 0), ("gateway", 0)} <= fetched, cluster.kubelet.init_runs
    downloads = {p for method, p, _ in fake.requests if method == "GET" and "/resolve/" in p}
    assert any(p.endswith("/model.safetensors") for p in downloads), "the worker fetched the weights"
    answer = httpx.post(
        f"{gateway_url(cluster)}/v1/embeddings", json={"model": MODEL_NAME, "input": TEXTS}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    got = np.array([row["embedding"] for row in answer.json()["data"]])
    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(str(bundled_model_dir()), device="cpu").encode(
        TEXTS, normalize_embeddings=True
    )
    cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() >= 0.999, cosines


def test_a_repository_the_hub_lacks_is_model_fetch_failed_naming_it(cluster, example, hub):
    _, url = hub
    apply(cluster, hub_model(example, url, repo="acme/no-such-model"))
    failed = cluster.wait(
        "ModelFetchFailed",
        lambda: (c := condition(cluster.model(), "ModelFetchFailed")) and c["status"] == "True" and c,
        timeout_s=60,
    )
    assert failed["reason"] == "NotFound" and "acme/no-such-model" in failed["message"]
    assert not cluster.items("/apis/apps/v1", "deployments") or all(
        "worker" not in d["metadata"]["name"] for d in cluster.items("/apis/apps/v1", "deployments")
    )
