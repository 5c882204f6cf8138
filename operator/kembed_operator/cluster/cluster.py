"""`KubeCluster`: the `Cluster` calls over the `kubernetes` client's REST layer, answering plain dicts.

Generic paths rather than the typed APIs: the operator reads and writes dicts (its manifests are
dicts) and needs nothing from the generated models. Failures become `ClusterError`, which says
whether a retry can help (conflicts, throttling, server errors, no connection).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import kubernetes
import urllib3

from kembed.operator.build.naming import MANAGED_BY, Owner
from kembed.operator.cluster.rbac import KINDS
from kembed.operator.spec.spec import GROUP, KIND, VERSION

MAX_LOG_BYTES = 4 << 20  # a golden Job's record line is ~5.5 bytes per float: 16 texts x 32k floats


class ClusterError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status

    @property
    def is_retryable(self) -> bool:
        return self.status in (0, 409, 429) or self.status >= 500


def _path(kind: str, namespace: str, name: str = "") -> str:
    group, version, resource = KINDS[kind]
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    return f"{base}/namespaces/{namespace}/{resource}" + (f"/{name}" if name else "")


class KubeCluster:
    """The operator's API calls, synchronous (kopf runs sync handlers in its thread pool)."""

    def __init__(self, api: kubernetes.client.ApiClient, timeout_s: float) -> None:
        self._api = api
        self._timeout_s = timeout_s
        # (kind, namespace, name) of optional objects seen absent, not asked for again (delete_if_present)
        self._absent: set[tuple[str, str, str]] = set()

    @classmethod
    def from_environment(cls, timeout_s: float) -> KubeCluster:
        """In-cluster service account, else the kubeconfig (local runs, tests)."""
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        return cls(kubernetes.client.ApiClient(), timeout_s)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        data = self._send(
            method, path, body, query, {"Accept": "application/json", "Content-Type": content_type}
        )
        if data is None:
            return None
        return json.loads(data) if data else {}

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        query: list[tuple[str, str]] | None,
        headers: dict[str, str],
    ) -> bytes | None:
        """The answer's body; None on a 404; ClusterError on another failure."""
        method, url, headers, payload, _ = self._api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(
                method, url, header_params=headers, body=payload, _request_timeout=self._timeout_s
            )
            data: bytes = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise ClusterError(0, f"{method} {path}: {error}") from None
        if response.status == 404:
            return None
        if response.status >= 400:
            raise ClusterError(response.status, f"{method} {path}: {data[:500]!r}")
        return data

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path(kind, namespace, name))

    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        answer = self._call("GET", _path(kind, namespace), query=[("labelSelector", selector)]) or {}
        items = answer.get("items") or []
        # Filtered here too: a label selector the server ignored must not widen what we delete.
        return [
            i for i in items if all(i["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())
        ]

    def pod_log(self, namespace: str, name: str, container: str) -> str | None:
        """A pod's container log (its first MAX_LOG_BYTES); None if the pod is gone."""
        query = [("container", container), ("limitBytes", str(MAX_LOG_BYTES))]
        data = self._send(
            "GET", f"{_path('Pod', namespace, name)}/log", None, query, {"Accept": "text/plain"}
        )
        return None if data is None else bytes(data).decode(errors="replace")

    def serves(self, kind: str, namespace: str) -> bool:
        """Whether the API server serves `kind` at all (a CRD's kind: its CRD is installed). A
        missing object and a missing kind both answer 404 to a get, so ask for the collection."""
        return self._call("GET", _path(kind, namespace), query=[("limit", "1")]) is not None

    def create(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        self._absent.discard((body["kind"], meta["namespace"], meta["name"]))
        try:
            self._call("POST", _path(body["kind"], meta["namespace"]), body=body)
        except ClusterError as error:
            if error.status != 409:  # made meanwhile by an overlapping pass: the next pass compares it
                raise

    def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._absent.discard((kind, namespace, name))
        self._call(
            "PATCH", _path(kind, namespace, name), body=body, content_type="application/merge-patch+json"
        )

    def delete(self, kind: str, namespace: str, name: str) -> None:
        # Background: the Job's pods and the Deployment's ReplicaSets go with them.
        self._call("DELETE", _path(kind, namespace, name), body={"propagationPolicy": "Background"})

    def delete_if_present(self, kind: str, namespace: str, name: str) -> None:
        """Delete an object the operator makes only for some specs (the bulk gateway's, a monitor, the
        gateway's autoscaler) if it is there. Once seen absent it is not asked for again until this
        process creates or patches it, so a model without one costs no call per reconcile pass.
        (Only the operator makes these; a restarted operator asks once more.)"""
        key = (kind, namespace, name)
        if key in self._absent:
            return
        if self.get(kind, namespace, name) is not None:
            self.delete(kind, namespace, name)
        self._absent.add(key)

    def event(self, owner: Owner, type_: str, reason: str, message: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{owner.name}.", "namespace": owner.namespace},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": owner.name,
                "namespace": owner.namespace,
                "uid": owner.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": MANAGED_BY},
            "reportingComponent": MANAGED_BY,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call("POST", _path("Event", owner.namespace), body=body)
