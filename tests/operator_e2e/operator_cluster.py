"""`Cluster`: what a scenario drives — the API stand-in, the local kubelet and the operator process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
from local_kubelet import LocalKubelet
from local_ports import free_port

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "charts/kembed/crds/embeddingmodels.kembed.dev.yaml"
EXAMPLE = ROOT / "charts/kembed/examples/minilm-cpu.yaml"
NAMESPACE = "default"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"  # the example's servedName
MODELS = "/apis/kembed.dev/v1alpha1/namespaces/default/embeddingmodels"
NODE_MODEL_DIR = "/var/lib/kembed/models/all-MiniLM-L6-v2"  # the example's hostPath
CORRUPT_MODEL_DIR = "/var/lib/kembed/models/corrupt"  # scenario 3's hostPath


@dataclass
class Cluster:
    api: httpx.Client
    kubeconfig: Path
    kubelet: LocalKubelet
    log_dir: Path
    operator: subprocess.Popen | None = None
    metrics_port: int = 0  # the running operator's, once started

    def start_operator(self, **settings: str) -> None:
        """`python -P -m kembed.operator` against the emulator, in the test namespace, fast timers;
        `settings` are more KEMBED_OPERATOR_* variables (hot_buckets_interval_s="1")."""
        self.metrics_port = free_port()  # 9090 may be taken by a Prometheus
        env = dict(
            os.environ,
            KUBECONFIG=str(self.kubeconfig),
            KEMBED_OPERATOR_NAMESPACES=NAMESPACE,
            KEMBED_OPERATOR_RECONCILE_INTERVAL_S="1",
            KEMBED_OPERATOR_RETRY_DELAY_S="1",
            KEMBED_OPERATOR_HEALTH_PORT=str(free_port()),  # 8081 may be taken on a shared host
            KEMBED_OPERATOR_METRICS_PORT=str(self.metrics_port),
            **{f"KEMBED_OPERATOR_{name.upper()}": value for name, value in settings.items()},
        )
        log = (self.log_dir / "operator.log").open("a")
        self.operator = subprocess.Popen(
            [sys.executable, "-P", "-m", "kembed.operator"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def kubectl(self, kubectl: Path, *args: str) -> str:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), HOME=str(self.log_dir.parent))
        done = subprocess.run([kubectl, *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def events(self) -> list[tuple[str, str]]:
        return [(e["type"], e["reason"]) for e in self.items("/api/v1", "events")]

    def kill_operator(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            self.operator.kill()
            self.operator.wait(10)

    def stop_operator(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            self.operator.terminate()
            try:
                self.operator.wait(15)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait(5)

    def model(self, name: str = "minilm") -> dict[str, Any] | None:
        answer = self.api.get(f"{MODELS}/{name}")
        return answer.json() if answer.status_code == 200 else None

    def items(self, prefix: str, plural: str) -> list[dict[str, Any]]:
        return self.api.get(f"{prefix}/namespaces/{NAMESPACE}/{plural}").json()["items"]

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float) -> Any:
        """Until `check()` is truthy; fails with the operator's and harness's story otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.operator is not None and self.operator.poll() is not None:
                pytest.fail(f"the operator exited with {self.operator.returncode}:\n{self.logs()}")
            result = check()
            if result:
                return result
            time.sleep(0.25)
        status = (self.model() or {}).get("status")
        pytest.fail(f"timed out after {timeout_s} s waiting for {what}\nstatus: {status}\n{self.logs()}")

    def logs(self) -> str:
        parts = [f"harness errors: {self.kubelet.errors[-10:]}"]
        for log in sorted(self.log_dir.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text()[-3000:]}")
        return "\n".join(parts)


def condition(model: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    conditions = ((model or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def apply(cluster: Cluster, body: dict[str, Any]) -> None:
    """Create through the kubernetes client, as `kubectl apply` of a new object would."""
    client = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    with client:
        kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
            "kembed.dev", "v1alpha1", NAMESPACE, "embeddingmodels", body
        )


def is_ready(cluster: Cluster) -> bool:
    model = cluster.model()
    return (
        bool(model)
        and (model.get("status") or {}).get("phase") == "Ready"
        and condition(model, "Ready")["status"] == "True"
    )


def start_ready(cluster: Cluster, body: dict[str, Any]) -> str:
    """Apply `body` and wait for phase Ready; its serving revision."""
    apply(cluster, body)
    cluster.wait("phase Ready", lambda: is_ready(cluster), timeout_s=120)
    return cluster.model()["status"]["activeRevision"]


def patch_spec(cluster: Cluster, spec: dict[str, Any]) -> None:
    answer = cluster.api.patch(
        f"{MODELS}/minilm", json={"spec": spec}, headers={"Content-Type": "application/merge-patch+json"}
    )
    answer.raise_for_status()


def gateway_url(cluster: Cluster) -> str:
    (pod,) = cluster.kubelet.pods_of("minilm-gateway")
    return f"http://{pod.ip}:8080"
