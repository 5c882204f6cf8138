"""The kopf handlers: thin. Each parses nothing itself, calls `reconcile` and writes the status.

Create, update (spec or scale), resume (operator start) and a timer all run the same idempotent
`reconcile`; a per-model lock keeps the timer and an event handler from interleaving (sync handlers
run in kopf's thread pool). A second, slower timer keeps each model's hot list current
(hot_buckets.py). A watch event of a deleted model drops its phase from the metrics. The API client,
default images, locks and metrics live in kopf's `memo`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from kembed.operator.cluster import hot_buckets
from kembed.operator.cluster.cluster import ClusterError, KubeCluster
from kembed.operator.cluster.reconcile import Images, InvalidSpec, invalid_status, reconcile
from kembed.operator.metrics import OperatorMetrics
from kembed.operator.settings import OperatorSettings
from kembed.operator.spec.spec import GROUP, PLURAL, VERSION


def plain(value: Any) -> Any:
    """kopf's body views as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def reconcile_handler(body: Mapping[str, Any], memo: kopf.Memo, patch: kopf.Patch, **_: Any) -> None:
    raw = plain(body)
    now = datetime.now(UTC)
    metrics: OperatorMetrics = memo.metrics
    namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
    with memo.locks.setdefault(raw["metadata"]["uid"], threading.Lock()):
        started, result = time.perf_counter(), "error"
        try:
            status = reconcile(
                memo.cluster,
                raw,
                memo.images,
                now,
                metrics.hooks(),
                operator_namespace=memo.settings.pod_namespace,
            )
            result = "ok"
        except InvalidSpec as error:
            result = "invalid"
            invalid = invalid_status(raw, str(error), now)
            metrics.phases.set(namespace, name, invalid["phase"])
            patch.status.update(invalid)
            raise kopf.PermanentError(f"invalid spec: {error}") from None
        except ClusterError as error:
            if error.is_retryable:
                result = "retry"
                raise kopf.TemporaryError(str(error), delay=memo.settings.retry_delay_s) from None
            raise
        finally:
            metrics.reconciles.labels(result).inc()
            metrics.reconcile_duration.observe(time.perf_counter() - started)
    metrics.phases.set(namespace, name, status["phase"])
    if status != raw.get("status"):
        patch.status.update(status)


def deleted_handler(event: Mapping[str, Any], body: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    """A model gone from the API: its phase series go too. A watch event, not a delete handler, so
    that no finalizer holds the model; under its lock, so that a reconcile in flight cannot set the
    phase again after it."""
    if event.get("type") != "DELETED":
        return
    metadata = body["metadata"]
    with memo.locks.setdefault(metadata["uid"], threading.Lock()):
        memo.metrics.phases.forget(metadata["namespace"], metadata["name"])


def hot_buckets_handler(body: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    """Keep the model's hot list current (hot_buckets.py). It writes only that ConfigMap, so it takes
    no lock; a spec `reconcile` refuses is left to it to report."""
    try:
        hot_buckets.refresh(memo.cluster, plain(body))
    except InvalidSpec:
        return
    except ClusterError as error:
        if error.is_retryable:
            raise kopf.TemporaryError(str(error), delay=memo.settings.retry_delay_s) from None
        raise


def register(
    registry: kopf.OperatorRegistry, settings: OperatorSettings, metrics: OperatorMetrics | None = None
) -> None:
    """Register the handlers for these settings (the timer interval is a setting); they record into
    `metrics` (a registry nobody serves if None)."""
    metrics = OperatorMetrics() if metrics is None else metrics
    resource = (GROUP, VERSION, PLURAL)

    def startup(memo: kopf.Memo, **kwargs: Any) -> None:
        settings_: kopf.OperatorSettings = kwargs["settings"]  # kopf passes it by this name only
        settings_.peering.standalone = True  # one replica; leader election is the Deployment's job
        # Progress and diff-base in annotations: status is ours, and the schema prunes unknown fields.
        settings_.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings_.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
        settings_.posting.level = 30  # kopf posts warnings and errors as Events; our own say the rest
        memo.settings = settings
        memo.cluster = KubeCluster.from_environment(settings.api_timeout_s)
        memo.images = Images(worker=settings.worker_image, gateway=settings.gateway_image)
        memo.locks = {}
        memo.metrics = metrics

    kopf.on.startup(registry=registry)(startup)
    # A registry of our own starts empty: kopf's default login handlers live in its default registry.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    for decorate in (kopf.on.create, kopf.on.update, kopf.on.resume):
        decorate(*resource, registry=registry, id="reconcile")(reconcile_handler)
    kopf.on.event(*resource, registry=registry, id="deleted")(deleted_handler)
    kopf.timer(
        *resource,
        registry=registry,
        id="drift",
        interval=settings.reconcile_interval_s,
        initial_delay=settings.reconcile_interval_s,
    )(reconcile_handler)
    if settings.hot_buckets_interval_s > 0:
        kopf.timer(
            *resource,
            registry=registry,
            id="hot-buckets",
            interval=settings.hot_buckets_interval_s,
            initial_delay=settings.hot_buckets_interval_s,
        )(hot_buckets_handler)
