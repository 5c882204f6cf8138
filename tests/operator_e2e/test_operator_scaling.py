"""Scaling under load with the real operator, gateway and workers (issue "Kubernetes at scale").

While a few clients post small embedding requests the whole time (client_load.py), the worker
Deployment is scaled 1 → 3 and 3 → 1 and a worker pod is deleted. The gateway follows the workers'
headless Service through the stand-in's cluster DNS (gateway_entry.py, cluster_dns.py): a new pod
must get work within seconds of being Ready, a leaving one must cost no request, and the gateway pod
is never replaced (worker.replicas is not part of its template). A pod added by scaling prewarms the
hot list the operator keeps from the serving workers' bucket hits, which never rolls a Deployment.
"""

from __future__ import annotations

import time

import grpc
import httpx
import pytest
from client_load import ClientLoad
from local_kubelet import LocalPod
from operator_cluster import gateway_url, patch_spec, start_ready

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

MAX_UNTIL_WORK_S = 10  # from the last new pod Ready until every pod has served requests
WORKER_METRICS_PORT = 9091  # operator/kembed_operator/build/manifests.py WORKER_METRICS_PORT


def worker_pods(cluster, revision: str) -> list[LocalPod]:
    return cluster.kubelet.pods_of(f"minilm-worker-{revision}")


def requests_served(pod: LocalPod) -> float:
    """Embed/Score requests the worker answered, from its own /metrics (0 while it cannot say)."""
    try:
        text = httpx.get(f"http://{pod.ip}:{WORKER_METRICS_PORT}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0
    prefix = "kembed_worker_request_duration_seconds_count"
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def gateway_workers(cluster) -> dict[str, dict]:
    """The replicas the gateway holds now, by pod IP (its /info)."""
    workers = httpx.get(f"{gateway_url(cluster)}/info", timeout=5).json()["workers"]
    return {w["address"].rpartition(":")[0]: w for w in workers}


def gateway_follows(cluster, pods: list[LocalPod]) -> bool:
    """The gateway holds exactly `pods`' replicas, each serving."""
    workers = gateway_workers(cluster)
    return set(workers) == {p.ip for p in pods} and all(w["serving"] for w in workers.values())


def everyone_served(pods: list[LocalPod]) -> bool:
    return all(requests_served(p) > 0 for p in pods)


def the_gateway(cluster) -> tuple[str, int]:
    (pod,) = cluster.kubelet.pods_of("minilm-gateway")
    assert pod.popen.poll() is None, f"gateway {pod.name} exited with {pod.popen.returncode}"
    return pod.name, pod.popen.pid


def gateway_generation(cluster) -> int:
    """The gateway Deployment's generation: it moves with any change of its spec."""
    deployment = cluster.api.get("/apis/apps/v1/namespaces/default/deployments/minilm-gateway").json()
    return deployment["metadata"]["generation"]


def scale_to(cluster, revision: str, replicas: int) -> list[LocalPod]:
    """Patch worker.replicas; the revision's pods once exactly that many run, all Ready."""
    patch_spec(cluster, {"worker": {"replicas": replicas}})
    return cluster.wait(
        f"{replicas} worker pods Ready",
        lambda: (
            pods
            if len(pods := worker_pods(cluster, revision)) == replicas and all(p.is_ready for p in pods)
            else None
        ),
        timeout_s=60,
    )


def exited(pods: list[LocalPod]) -> list[int] | None:
    """Their processes' exit codes once every one has exited (0: drained and stopped on SIGTERM)."""
    codes = [p.popen.poll() for p in pods]
    return None if None in codes else codes


def test_scaling_up_under_load_gives_every_new_pod_work_within_seconds(cluster, example):
    revision = start_ready(cluster, example)
    gateway, generation = the_gateway(cluster), gateway_generation(cluster)
    with ClientLoad(gateway_url(cluster)) as load:
        load.wait_for_more(20)
        started = time.monotonic()
        pods = scale_to(cluster, revision, 3)
        last_ready = max(p.ready_at for p in pods)
        cluster.wait("every worker pod served requests", lambda: everyone_served(pods), timeout_s=30)
        until_work = time.monotonic() - last_ready
        load.wait_for_more(20)
    assert until_work <= MAX_UNTIL_WORK_S, f"the last new pod got work {until_work:.1f} s after Ready"
    assert load.failures == []
    assert gateway_follows(cluster, pods)
    assert all(w["num_chunks_served"] > 0 for w in gateway_workers(cluster).values())
    assert (the_gateway(cluster), gateway_generation(cluster)) == (gateway, generation)
    print(
        f"1 -> 3 workers: all Ready {last_ready - started:.1f} s after the patch, every one served "
        f"{until_work:.1f} s after the last was Ready; {load.num_ok} answers, {len(load.failures)} failed"
    )


def test_scaling_down_under_load_fails_no_request(cluster, example):
    example["spec"]["worker"]["replicas"] = 3
    revision = start_ready(cluster, example)
    pods = worker_pods(cluster, revision)
    gateway = the_gateway(cluster)
    cluster.wait("the gateway holding 3 workers", lambda: gateway_follows(cluster, pods), timeout_s=30)
    with ClientLoad(gateway_url(cluster)) as load:
        cluster.wait("every worker pod served requests", lambda: everyone_served(pods), timeout_s=30)
        started = time.monotonic()
        (kept,) = scale_to(cluster, revision, 1)
        cluster.wait("the gateway holding 1 worker", lambda: gateway_follows(cluster, [kept]), timeout_s=30)
        drained = time.monotonic() - started
        removed = [p for p in pods if p is not kept]
        codes = cluster.wait("the removed workers exited", lambda: exited(removed), timeout_s=30)
        load.wait_for_more(20)
    assert codes == [0, 0]
    assert load.failures == []
    assert the_gateway(cluster) == gateway
    print(f"3 -> 1 workers: the gateway let go of 2 in {drained:.1f} s; {load.num_ok} answers, 0 failed")


def test_deleting_a_worker_pod_under_load_fails_no_request(cluster, example):
    example["spec"]["worker"]["replicas"] = 2
    revision = start_ready(cluster, example)
    pods = worker_pods(cluster, revision)
    gateway = the_gateway(cluster)
    cluster.wait("the gateway holding 2 workers", lambda: gateway_follows(cluster, pods), timeout_s=30)
    with ClientLoad(gateway_url(cluster)) as load:
        cluster.wait("every worker pod served requests", lambda: everyone_served(pods), timeout_s=30)
        started = time.monotonic()
        deleted = pods[0]
        # as `kubectl delete pod` does
        cluster.api.delete(f"/api/v1/namespaces/default/pods/{deleted.name}").raise_for_status()
        replaced = cluster.wait(
            "a replacement pod Ready and serving",
            lambda: (
                now
                if len(now := worker_pods(cluster, revision)) == 2
                and deleted not in now
                and all(p.is_ready for p in now)
                and gateway_follows(cluster, now)
                and everyone_served(now)
                else None
            ),
            timeout_s=60,
        )
        back = time.monotonic() - started
        codes = cluster.wait("the deleted pod's worker exited", lambda: exited([deleted]), timeout_s=30)
        load.wait_for_more(20)
    assert codes == [0]
    assert load.failures == []
    assert the_gateway(cluster) == gateway
    assert {p.name for p in replaced} - {p.name for p in pods}
    print(f"worker pod deleted: replaced and serving after {back:.1f} s; {load.num_ok} answers, 0 failed")


HOT_LIST = "/api/v1/namespaces/default/configmaps/minilm-hot-buckets"


def hot_list(cluster) -> list[str]:
    """The buckets in the model's hot-buckets ConfigMap (empty while there is none)."""
    answer = cluster.api.get(HOT_LIST)
    return answer.json()["data"]["buckets"].split(",") if answer.status_code == 200 else []


def bucket_stats(pod: LocalPod) -> dict[str, tuple[int, bool]]:
    """(hits, captured) by bucket, from the worker's own stats RPC (what `kembed-worker stats` reads)."""
    with grpc.insecure_channel(f"{pod.ip}:50051") as channel:
        reply = pb_grpc.EmbedderStub(channel).BucketStats(pb.BucketStatsRequest(), timeout=10)
    return {f"{s.bucket.num_sequences}x{s.bucket.num_tokens}": (s.hits, s.captured) for s in reply.buckets}


def test_a_pod_added_by_scaling_prewarms_the_hot_list_the_operator_keeps(cluster, example):
    cluster.stop_operator()
    cluster.start_operator(hot_buckets_interval_s="1")  # the chart's default is 300
    example["spec"]["graphs"] = {"hotBuckets": 3}
    revision = start_ready(cluster, example)
    (first,) = worker_pods(cluster, revision)
    deployment = f"/apis/apps/v1/namespaces/default/deployments/minilm-worker-{revision}"
    before = cluster.api.get(deployment).json()
    with ClientLoad(gateway_url(cluster)) as load:
        cluster.wait("a hot list of 3 buckets", lambda: len(hot_list(cluster)) == 3, timeout_s=30)
        load.wait_for_more(20)
    assert load.failures == []
    # The load has stopped, so no pass sees new hits: the list settles and stays (an idle model keeps
    # its list; which three rank first by recent hits is tested in tests/operator). Settled: the same
    # three buckets over 3 s, three passes of the timer.
    served = {b: hits for b, (hits, _) in bucket_stats(first).items() if hits}
    readings: list[list[str]] = []

    def settled() -> bool:
        readings.append(hot_list(cluster))
        time.sleep(1)
        return len(readings) >= 4 and len(readings[-1]) == 3 and all(r == readings[-1] for r in readings[-4:])

    cluster.wait("the hot list to settle", settled, timeout_s=20)
    hottest = readings[-1]
    assert set(hottest) <= set(served), (hottest, served)  # buckets traffic hit, on the serving pod
    after = cluster.api.get(deployment).json()
    assert after["metadata"]["generation"] == before["metadata"]["generation"]  # never rolled
    assert after["spec"]["template"] == before["spec"]["template"]
    assert first.popen.poll() is None and worker_pods(cluster, revision) == [first]

    pods = scale_to(cluster, revision, 2)
    (added,) = [p for p in pods if p is not first]
    log = added.log.read_text()
    said = "prewarming 3 hot buckets from the operator's hot list (KEMBED_WORKER_PREWARM_OBSERVED) first"
    assert f"{said}: {', '.join(hottest)}" in log
    # On the CPU engine nothing is captured: its stats mark the buckets prewarm was given (a GPU
    # worker reports them as captured graphs; tests/worker/test_gpu_prewarm.py).
    stats = bucket_stats(added)
    assert {b for b, (_, captured) in stats.items() if captured} == set(hottest)
    assert "hot list from 1 pod(s) of revision" in (cluster.log_dir / "operator.log").read_text()
    print(f"hot list {hottest} from {sum(served.values())} batches; the added pod prewarmed it first")
