"""A model from a Hugging Face Hub source, end to end on the stand-in cluster: the real operator runs
the resolve Job (the real `fetch-model --resolve-only` against a local Hub endpoint serving the bundled
all-MiniLM-L6-v2, tests/worker/fake_hub.py), the local kubelet runs each pod's real fetch init
container before the real worker and gateway start, and the gateway answers with the bundled model's
embeddings. After a push to `main`, a worker pod deleted is replaced by one that fetches the commit
its revision was made from, and the model keeps serving. A repository the Hub lacks is
ModelFetchFailed, naming it, within seconds; so is a worker pod whose fetch fails (its init container's
status, as the kubelet writes it), until a retry after its back-off succeeds."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from operator_cluster import MODEL_NAME, NAMESPACE, apply, condition, gateway_url, is_ready

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from fake_hub import Commit, FakeHub, FakeRepo, files_of

from kembed.worker.config import bundled_model_dir

pytestmark = pytest.mark.slow
SHA = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
PUSHED_SHA = "2" * 40  # main after a push: other weights' config
TEXTS = ["hello kubernetes", "a model fetched from the hub, verified, then served"]


@pytest.fixture
def hub(tmp_path):
    bundled = bundled_model_dir()
    pushed = tmp_path / "pushed-config.json"
    pushed.write_text((bundled / "config.json").read_text().replace('"gelu"', '"gelu_new"'))
    commits = [
        Commit(SHA, files_of(bundled)),
        Commit(PUSHED_SHA, files_of(bundled) | {"config.json": pushed}),
    ]
    repo = FakeRepo(commits, {"main": SHA})
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


def test_after_main_moved_a_deleted_worker_pod_comes_back_with_the_resolved_commit(cluster, example, hub):
    fake, url = hub
    apply(cluster, hub_model(example, url))
    cluster.wait("phase Ready", lambda: is_ready(cluster), timeout_s=180)
    revision = cluster.model()["status"]["activeRevision"]
    fake.repos[MODEL_NAME].branches["main"] = PUSHED_SHA  # a push upstream; refreshSeconds is 0
    fake.requests.clear()
    num_runs = len(cluster.kubelet.init_runs)
    (deleted,) = cluster.kubelet.pods_of(f"minilm-worker-{revision}")
    cluster.api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{deleted.name}").raise_for_status()
    replaced = cluster.wait(
        "a new worker pod, ready",
        lambda: (
            [p for p in cluster.kubelet.pods_of(f"minilm-worker-{revision}") if p.is_ready]
            and all(p.name != deleted.name for p in cluster.kubelet.pods_of(f"minilm-worker-{revision}"))
            and cluster.kubelet.pods_of(f"minilm-worker-{revision}")
        ),
        timeout_s=120,
    )
    runs = cluster.kubelet.init_runs[num_runs:]
    assert runs == [(f"minilm-worker-{revision}", "fetch-model", 0)], runs
    downloads = [p for method, p, _ in fake.requests if method == "GET" and "/resolve/" in p]
    assert downloads and all(f"/resolve/{SHA}/" in p for p in downloads), downloads
    assert not [p for _, p, _ in fake.requests if "main" in p], "main is never asked again"
    time.sleep(1)  # a reconcile pass or more: nothing else moves
    status = cluster.model()["status"]
    assert (status["activeRevision"], status["model"]["serving"]) == (revision, SHA)
    assert condition(cluster.model(), "ModelFetchFailed")["status"] == "False"

    def embeds() -> bool:
        body = {"model": MODEL_NAME, "input": TEXTS}
        return httpx.post(f"{gateway_url(cluster)}/v1/embeddings", json=body, timeout=30).status_code == 200

    cluster.wait("the gateway answering through the replacement worker", embeds, timeout_s=60)
    assert len(replaced) == 1


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


def test_a_worker_pods_failed_fetch_is_model_fetch_failed_naming_the_pod_until_it_succeeds(
    cluster, example, hub
):
    fake, url = hub
    fake.corrupt.add("model.safetensors")  # what the Hub serves of it no longer matches its sha256
    apply(cluster, hub_model(example, url))
    failed = cluster.wait(
        "ModelFetchFailed from the worker pod",
        lambda: (c := condition(cluster.model(), "ModelFetchFailed")) and c["status"] == "True" and c,
        timeout_s=120,
    )
    assert failed["reason"] == "ChecksumMismatch", failed
    assert "model.safetensors" in failed["message"] and "pod minilm-worker-" in failed["message"], failed
    pods = [p for p in cluster.items("/api/v1", "pods") if p["metadata"]["name"] in failed["message"]]
    (status,) = [s for p in pods for s in p["status"]["initContainerStatuses"]]
    assert status["lastState"]["terminated"]["exitCode"] == 1 and status["name"] == "fetch-model"
    started = time.monotonic()
    time.sleep(6)
    runs = [r for r in cluster.kubelet.init_runs if r[0].startswith("minilm-worker")]
    assert len(runs) <= 6, f"{len(runs)} runs: retried after a back-off, not at every pass"
    fake.corrupt.discard("model.safetensors")
    cluster.wait("phase Ready", lambda: is_ready(cluster), timeout_s=120)
    cluster.wait(
        "ModelFetchFailed cleared",
        lambda: condition(cluster.model(), "ModelFetchFailed")["status"] == "False",
        timeout_s=30,
    )
    print(f"fetch failed, shown, then fetched {time.monotonic() - started:.1f} s after the fix")
    expected = [e for e in cluster.kubelet.errors if "init container fetch-model of minilm-worker" in e]
    assert expected and all('"checksum"' in e for e in expected), expected
    cluster.kubelet.errors[:] = [e for e in cluster.kubelet.errors if e not in expected]
