"""The operator keeps each model's hot list current: it reads the serving revision's ready workers'
bucket hits from their metrics text, sums them, and writes the `graphs.hotBuckets` hottest into the
model's hot-buckets ConfigMap, which worker pods read when they start; writing it never touches a
Deployment. Idle or unreadable workers leave the last list; hotBuckets 0 removes it."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import kopf
import pytest
from operator_fakes import IMAGES, Driver, example
from prometheus_client import CollectorRegistry, generate_latest

from kembed.operator.build import manifests as m
from kembed.operator.build import naming as n
from kembed.operator.cluster import hot_buckets as h
from kembed.operator.cluster.reconcile import reconcile
from kembed.operator.handlers import hot_buckets_handler, register
from kembed.operator.settings import OperatorSettings, parse_settings
from kembed.worker.info import EngineStats
from kembed.worker.metrics import EngineCollector


def metrics(a: float, b: float, c: float) -> str:
    """A worker's /metrics text, rendered by the worker's own collector (the contract under test),
    with these hits for 1x64, 8x512 and 2x128."""
    registry = CollectorRegistry()
    stats = EngineStats(bucket_hits={"1x64": a, "8x512": b, "2x128": c})
    queue = SimpleNamespace(
        queued_tokens_by_class={},
        max_batch_tokens=1,
        max_batch_sequences=1,
        max_queued_tokens=1,
        num_lane_batches=0,
        num_groups=0,
        num_requests=0,
    )
    registry.register(EngineCollector(lambda: stats, queue, 0))
    return generate_latest(registry).decode()


def test_bucket_hits_are_read_from_the_metrics_text_and_nothing_else():
    text = metrics(3, 5, 0) + 'kembed_worker_bucket_hits_total{bucket="junk"} 9.0\n'
    assert h.parse_bucket_hits(text) == {"1x64": 3, "8x512": 5, "2x128": 0}
    with pytest.raises(ValueError):
        h.parse_bucket_hits("kembed_worker_bucket_hits_total{bucket=oops 1\n")


@pytest.mark.parametrize(
    ("per_pod", "count", "expected"),
    [
        ([{"1x64": 3, "8x512": 5}, {"1x64": 4, "2x128": 1}], 8, ["1x64", "8x512", "2x128"]),
        ([{"1x64": 3, "8x512": 5}, {"1x64": 4, "2x128": 1}], 1, ["1x64"]),  # summed: 7 beats 5
        ([{"8x512": 2, "1x128": 2, "2x128": 2}], 8, ["1x128", "2x128", "8x512"]),  # ties: smaller first
        ([{"1x64": 0}, {}], 8, []),  # no hits: nothing is hot
        ([], 8, []),
    ],
    ids=["summed", "bounded", "ties", "idle", "no-pods"],
)
def test_the_hottest_buckets_are_chosen_from_the_summed_hits(per_pod, count, expected):
    assert h.choose_hot(per_pod, count) == expected


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch):
    """Each test starts with an operator that has read no pod yet."""
    monkeypatch.setattr(h, "RECENT", h.Recent())


class Workers:
    """What the workers answer at each metrics URL; a URL mapped to an exception raises it."""

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, url: str, timeout_s: float) -> str:
        self.asked.append(url)
        answer = self.answers[url]
        if isinstance(answer, Exception):
            raise answer
        return str(answer)


@pytest.fixture
def serving() -> tuple[Driver, str]:
    """A model serving one revision of two ready workers (10.0.10.1, 10.0.10.2)."""
    spec = example("minilm-cpu.yaml")["spec"]
    spec["worker"]["replicas"] = 2
    spec.setdefault("graphs", {})["hotBuckets"] = 2
    driver = Driver(spec)
    return driver, driver.promote()


URL1, URL2 = "http://10.0.10.1:9091/metrics", "http://10.0.10.2:9091/metrics"


def hot_list(driver: Driver) -> dict | None:
    return driver.cluster.objects.get(("ConfigMap", "ml", "minilm-hot-buckets"))


def test_the_hot_list_is_written_without_touching_any_deployment(serving):
    driver, revision = serving
    deployments = {k: copy.deepcopy(o) for k, o in driver.cluster.objects.items() if k[0] == "Deployment"}
    driver.cluster.calls.clear()
    workers = Workers({URL1: metrics(3, 5, 1), URL2: metrics(4, 0, 1)})
    assert h.refresh(driver.cluster, driver.body, workers) == ["1x64", "8x512"]
    assert sorted(workers.asked) == [URL1, URL2]
    written = hot_list(driver)
    assert written["data"] == {"buckets": "1x64,8x512", "revision": revision, "podsRead": "2"}
    assert written["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # goes with the model
    assert "immutable" not in written
    # New counts: the list is patched in place; no Deployment was read for writing, or changed.
    h.refresh(driver.cluster, driver.body, Workers({URL1: metrics(0, 9, 50), URL2: metrics(1, 0, 0)}))
    assert hot_list(driver)["data"]["buckets"] == "2x128,8x512"
    assert {verb for verb, kind in driver.cluster.calls if kind == "Deployment"} == set()
    assert {k: o for k, o in driver.cluster.objects.items() if k[0] == "Deployment"} == deployments
    # ...and the reconcile that follows leaves both the Deployments and the list alone.
    driver.cluster.calls.clear()
    driver.step()
    assert ("patch", "Deployment") not in driver.cluster.calls
    assert hot_list(driver)["data"]["buckets"] == "2x128,8x512"


def test_every_worker_pod_reads_the_list_at_start_from_a_template_that_never_names_its_content(serving):
    driver, revision = serving
    (deployment,) = driver.cluster.named("Deployment", "worker", revision)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (ref,) = [e for e in container["env"] if e["name"] == "KEMBED_WORKER_PREWARM_OBSERVED"]
    assert ref["valueFrom"]["configMapKeyRef"] == {
        "name": "minilm-hot-buckets",
        "key": "buckets",
        "optional": True,
    }
    h.refresh(driver.cluster, driver.body, Workers({URL1: metrics(3, 5, 1), URL2: metrics(4, 0, 1)}))
    assert driver.cluster.named("Deployment", "worker", revision) == [deployment]


@pytest.mark.parametrize(
    "answers",
    [{URL1: metrics(0, 0, 0), URL2: metrics(0, 0, 0)}, {URL1: OSError("refused"), URL2: "not metrics {"}],
    ids=["idle", "unreadable"],
)
def test_idle_or_unreadable_workers_leave_the_last_list(serving, answers, caplog):
    driver, _ = serving
    h.refresh(driver.cluster, driver.body, Workers({URL1: metrics(3, 5, 1), URL2: metrics(4, 0, 1)}))
    before = copy.deepcopy(hot_list(driver))
    assert h.refresh(driver.cluster, driver.body, Workers(answers)) is None
    assert hot_list(driver) == before
    if "unreadable" in str(answers):
        assert "bucket hits unreadable at http://10.0.10.1:9091/metrics" in caplog.text


def test_one_unreadable_pod_does_not_keep_the_others_from_counting(serving):
    driver, _ = serving
    workers = Workers({URL1: OSError("timed out"), URL2: metrics(0, 2, 1)})
    assert h.refresh(driver.cluster, driver.body, workers) == ["8x512", "2x128"]
    assert hot_list(driver)["data"]["podsRead"] == "1"


def test_only_ready_pods_of_the_serving_revision_are_read_and_at_most_eight(serving):
    driver, revision = serving
    template = driver.cluster.named("Deployment", "worker", revision)[0]["spec"]["template"]
    for i in range(12):  # more ready pods than are read
        driver.cluster.objects[("Pod", "ml", f"extra-{i:02d}")] = {
            "metadata": {"name": f"extra-{i:02d}", "labels": template["metadata"]["labels"]},
            "spec": {"containers": [{"ports": [{"name": "metrics", "containerPort": 9999}]}]},
            "status": {"podIP": f"10.1.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]},
        }
    driver.cluster.objects[("Pod", "ml", "extra-00")]["status"]["conditions"][0]["status"] = "False"
    urls = h.serving_pod_urls(driver.cluster, n.Owner("minilm", "ml", "uid-1"), revision)
    assert len(urls) == h.MAX_PODS_READ
    assert urls[0] == "http://10.1.0.1:9999/metrics"  # extra-00 is not ready; the port is the pod's
    assert h.serving_pod_urls(driver.cluster, n.Owner("minilm", "ml", "uid-1"), "other") == []


def test_nothing_is_read_before_a_revision_serves():
    driver = Driver(example("minilm-cpu.yaml")["spec"])
    driver.step()
    workers = Workers({})
    assert h.refresh(driver.cluster, driver.body, workers) is None
    assert workers.asked == [] and hot_list(driver) is None


def test_hot_buckets_zero_removes_the_list(serving):
    driver, _ = serving
    h.refresh(driver.cluster, driver.body, Workers({URL1: metrics(3, 5, 1), URL2: metrics(4, 0, 1)}))
    driver.edit("graphs", hotBuckets=0)
    workers = Workers({})
    assert h.refresh(driver.cluster, driver.body, workers) is None
    assert hot_list(driver) is None and workers.asked == []


def test_the_hot_list_config_map_is_valid_kubernetes():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    body = h.hot_config_map(n.Owner("m", "ml", "u"), ["1x64", "8x512"], "abcd1234", 2)
    kubernetes_validate.validate(body, "1.35.0", strict=True)
    assert body["data"][m.HOT_LIST_KEY] == "1x64,8x512"


def test_the_interval_is_a_setting_five_minutes_by_default_and_zero_turns_the_timer_off():
    assert parse_settings([], {}).hot_buckets_interval_s == 300.0
    assert parse_settings([], {"KEMBED_OPERATOR_HOT_BUCKETS_INTERVAL_S": "30"}).hot_buckets_interval_s == 30.0
    for interval, expected in ((60.0, True), (0.0, False)):
        registry = kopf.OperatorRegistry()
        register(registry, OperatorSettings(hot_buckets_interval_s=interval))
        timers = {hd.id: hd for hd in registry._spawning.get_all_handlers()}
        assert ("hot-buckets" in timers) is expected
        if expected:
            assert timers["hot-buckets"].interval == interval


def test_the_handler_leaves_a_bad_spec_to_reconcile():
    memo = kopf.Memo(cluster=None, settings=OperatorSettings())
    body = {"metadata": {"name": "m", "namespace": "ml", "uid": "u"}, "spec": {"worker": {"replicas": -1}}}
    assert hot_buckets_handler(body=body, memo=memo) is None


def test_reconcile_admits_the_operator_namespace_to_the_worker_metrics_port():
    spec = example("minilm-cpu.yaml")["spec"]
    spec["networkPolicy"] = {"enabled": True, "metricsNamespaces": ["monitoring"]}
    driver = Driver(spec)
    reconcile(driver.cluster, driver.body, IMAGES, driver.now, operator_namespace="kembed-system")
    policy = driver.cluster.objects[("NetworkPolicy", "ml", "minilm-worker")]
    _, metrics_rule = policy["spec"]["ingress"]
    (peer,) = metrics_rule["from"]
    assert peer["namespaceSelector"]["matchExpressions"][0]["values"] == ["kembed-system", "monitoring"]


def test_the_list_follows_recent_traffic_not_a_pods_lifetime(serving):
    """Counters grow from a pod's start: ranked on them, a bucket hot for a long time would stay on
    the list long after traffic moved on. The score halves each pass before the new hits count."""
    driver, _ = serving
    # a long history of 1x64 and 8x512 (metrics(a, b, c): 1x64, 8x512, 2x128)
    assert h.refresh(
        driver.cluster, driver.body, Workers({URL1: metrics(5000, 4000, 0), URL2: metrics(0, 0, 0)})
    )
    assert hot_list(driver)["data"]["buckets"] == "1x64,8x512"
    # traffic moves to 2x128 (and a little 8x512): a few passes later the list says so
    a, b, c = 5000, 4000, 0
    for _ in range(4):
        a, b, c = a, b + 300, c + 1000
        h.refresh(driver.cluster, driver.body, Workers({URL1: metrics(a, b, c), URL2: metrics(0, 0, 0)}))
    assert hot_list(driver)["data"]["buckets"] == "2x128,8x512"
    # a pod restarted (its counters went down): its reading counts whole, not as a negative delta
    hot = h.refresh(driver.cluster, driver.body, Workers({URL1: metrics(0, 0, 2000), URL2: metrics(0, 0, 0)}))
    assert hot == ["2x128", "8x512"]


def test_an_idle_pass_keeps_the_scores_and_the_list(serving):
    driver, _ = serving
    busy = Workers({URL1: metrics(10, 0, 30), URL2: metrics(0, 0, 0)})
    assert h.refresh(driver.cluster, driver.body, busy) == ["2x128", "1x64"]
    for _ in range(5):  # the same counters: nothing new, nothing decays
        assert h.refresh(driver.cluster, driver.body, busy) is None
    assert h.refresh(
        driver.cluster, driver.body, Workers({URL1: metrics(10, 1, 30), URL2: metrics(0, 0, 0)})
    ) == [
        "2x128",
        "1x64",
    ]
