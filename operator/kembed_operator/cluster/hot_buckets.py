"""The hot list, kept current: on a timer the operator reads how often the serving revision's workers
hit each CUDA-graph bucket and keeps the `graphs.hotBuckets` most-hit ones in the model's hot-buckets
ConfigMap. Every worker pod of the model reads that list when it starts (KEMBED_WORKER_PREWARM_OBSERVED,
from a configMapKeyRef) and captures those buckets first, before it binds its port: a pod added by
the autoscaler or rescheduled onto another node has the shapes traffic hits now before it takes any.

- The counts come from each worker's metrics port (`kembed_worker_bucket_hits_total`, what Prometheus
  scrapes too): plain HTTP, no worker token and no gRPC in the operator. The worker NetworkPolicy
  admits the operator's namespace to that port (policies.py; the setting `pod_namespace`).
- A ConfigMap of its own, mutable, not the revision's immutable engine ConfigMap: the pod template
  only names it, so writing the list never rolls a Deployment, and an environment variable from a
  ConfigMap key is read when a container starts, so a running pod keeps what it started with. The
  reference is optional: a pod starts before the first list exists.
- One per model, not per revision: traffic's shapes are its clients', so a candidate revision's pods
  start with the serving revision's list too (its prewarm Job then finds those captured).
- Bounded: at most MAX_PODS_READ pods per pass, each within READ_TIMEOUT_S. An idle revision (no hits)
  or one that cannot be read leaves the last list as it is rather than emptying it.
- Current, not cumulative: a pod's counters grow from its start, so the operator remembers each pod's
  last reading and ranks by a score that halves every pass before the hits since the last one are
  added (`Recent`): a shape traffic stopped using falls out within a few passes, however long it
  was hot before. A pod whose counters went down restarted: its reading counts whole. The memory is
  the operator process's; after a restart the first pass ranks by the counters as they are.
"""

from __future__ import annotations

import logging
import re
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kembed.operator.build import manifests as m
from kembed.operator.build import naming as n
from kembed.operator.build.naming import Owner
from kembed.operator.cluster.apply import Cluster, apply
from kembed.operator.cluster.observed import is_ready
from kembed.operator.cluster.reconcile import owner_of, typed_spec
from kembed.operator.spec.status import parse_status

log = logging.getLogger("kembed.operator.cluster.hot_buckets")

BUCKETS_KEY = m.HOT_LIST_KEY  # the ConfigMap key the worker pods read (manifests.hot_list_env)
HITS_FAMILY = "kembed_worker_bucket_hits"  # a counter: its samples are named `<family>_total`
MAX_PODS_READ = 8  # a sum over 8 pods behind one balancer already ranks the buckets as all would
READ_TIMEOUT_S = 3.0  # a /metrics answer takes milliseconds; a pod that does not answer is skipped
_BUCKET = re.compile(r"^[1-9][0-9]*x[1-9][0-9]*$")

Fetch = Callable[[str, float], str]  # (url, timeout in s) -> body; OSError when it cannot be read


def fetch_url(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        body: bytes = answer.read()
    return body.decode()


def parse_bucket_hits(text: str) -> dict[str, float]:
    """Hits by bucket (`"8x512"`) from a worker's /metrics text; ValueError if it is not exposition."""
    hits: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        # prometheus_client's text format names the family `<name>_total`; OpenMetrics `<name>`
        if family.name not in (HITS_FAMILY, f"{HITS_FAMILY}_total"):
            continue
        for sample in family.samples:
            bucket = sample.labels.get("bucket", "")
            if sample.name == f"{HITS_FAMILY}_total" and _BUCKET.match(bucket):
                hits[bucket] = sample.value
    return hits


def _size(bucket: str) -> tuple[int, int]:
    seqs, _, tokens = bucket.partition("x")
    return int(tokens), int(seqs)


DECAY = 0.5  # each pass keeps this share of a bucket's score before adding its new hits


class Recent:
    """Per model, the last reading of each pod (by metrics URL) and the decayed score per bucket."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
        self._scores: dict[tuple[str, str], dict[str, float]] = {}

    def update(
        self, model: tuple[str, str], readings: Mapping[str, Mapping[str, float]]
    ) -> dict[str, float] | None:
        """The model's scores after this pass's `readings` (URL -> hits by bucket); None when no pod
        saw a hit since the last pass (an idle model keeps its list, and its scores)."""
        last = self._last.get(model, {})
        new: dict[str, float] = {}
        for url, hits in readings.items():
            before = last.get(url, {})
            restarted = any(hits.get(bucket, 0.0) < count for bucket, count in before.items())
            for bucket, count in hits.items():
                new[bucket] = new.get(bucket, 0.0) + (count if restarted else count - before.get(bucket, 0.0))
        self._last[model] = {url: dict(hits) for url, hits in readings.items()}
        scores = self._scores.get(model, {})
        if not any(count > 0 for count in new.values()):
            return None
        decayed = {bucket: score * DECAY for bucket, score in scores.items()}
        for bucket, count in new.items():
            decayed[bucket] = decayed.get(bucket, 0.0) + count
        self._scores[model] = {bucket: score for bucket, score in decayed.items() if score > 0.01}
        return dict(self._scores[model])

    def forget(self, model: tuple[str, str]) -> None:
        self._last.pop(model, None)
        self._scores.pop(model, None)


RECENT = Recent()  # the operator process's memory of the readings


def choose_hot(per_pod: Iterable[Mapping[str, float]], count: int) -> list[str]:
    """The `count` buckets with the most hits summed over the pods, most first; a tie goes to the
    smaller bucket (fewer tokens, then fewer sequences), so that the same counts give the same list.
    A bucket without hits is never hot."""
    total: Counter[str] = Counter()
    for hits in per_pod:
        total.update(hits)
    ranked = sorted((b for b, hits in total.items() if hits > 0), key=lambda b: (-total[b], _size(b)))
    return ranked[:count]


def hot_config_map(owner: Owner, buckets: Sequence[str], revision: str, num_pods: int) -> dict[str, Any]:
    """The model's hot list: `buckets` as the workers' flag reads it, plus where it was observed."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": m.metadata(owner, n.hot_buckets_name(owner), "worker"),
        "data": {BUCKETS_KEY: ",".join(buckets), "revision": revision, "podsRead": str(num_pods)},
    }


def _metrics_url(pod: dict[str, Any]) -> str:
    ports = [p for c in pod.get("spec", {}).get("containers", []) for p in c.get("ports", [])]
    port = next((p["containerPort"] for p in ports if p.get("name") == "metrics"), m.WORKER_METRICS_PORT)
    ip = pod["status"]["podIP"]
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/metrics"


def serving_pod_urls(cluster: Cluster, owner: Owner, revision: str) -> list[str]:
    """Metrics URLs of up to MAX_PODS_READ ready pods of `revision`, by pod name."""
    pods = cluster.list("Pod", owner.namespace, n.selector(owner, "worker", revision))
    ready = sorted((p for p in pods if is_ready(p)), key=lambda p: str(p["metadata"]["name"]))
    return [_metrics_url(p) for p in ready[:MAX_PODS_READ]]


def refresh(
    cluster: Cluster, body: dict[str, Any], fetch: Fetch = fetch_url, recent: Recent | None = None
) -> list[str] | None:
    """Write the hot list of the model in `body` from its serving workers' recent hits; the list
    written, or None when nothing was written. Raises reconcile.InvalidSpec for a spec it cannot read."""
    owner, spec = owner_of(body), typed_spec(body)
    name = n.hot_buckets_name(owner)
    model = (owner.namespace, owner.name)
    recent = recent or RECENT
    if spec.graphs.hot_buckets == 0:  # asked for none: a list left from before must not be prewarmed
        recent.forget(model)
        if cluster.get("ConfigMap", owner.namespace, name) is not None:
            cluster.delete("ConfigMap", owner.namespace, name)
            log.info("%s/%s: graphs.hotBuckets is 0, hot list removed", owner.namespace, owner.name)
        return None
    revision = parse_status(body.get("status")).active_revision
    if not revision:
        return None  # nothing serves yet: no traffic to learn from
    urls = serving_pod_urls(cluster, owner, revision)
    readings: dict[str, dict[str, float]] = {}
    for url in urls:
        try:
            readings[url] = parse_bucket_hits(fetch(url, READ_TIMEOUT_S))
        except (OSError, ValueError) as error:
            log.warning("%s/%s: bucket hits unreadable at %s: %s", owner.namespace, owner.name, url, error)
    per_pod = list(readings.values())
    scores = recent.update(model, readings)
    hot = [] if scores is None else choose_hot([scores], spec.graphs.hot_buckets)
    if not hot:
        return None  # idle or unreadable: the last list stays
    live = cluster.get("ConfigMap", owner.namespace, name)
    if live is None or live.get("data", {}).get(BUCKETS_KEY) != ",".join(hot):
        log.info(
            "%s/%s: hot list from %d pod(s) of revision %s: %s",
            owner.namespace,
            owner.name,
            len(per_pod),
            revision,
            ", ".join(hot),
        )
    apply(cluster, hot_config_map(owner, hot, revision, len(per_pod)))
    return hot
