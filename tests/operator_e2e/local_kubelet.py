"""`LocalKubelet`: the controllers and the kubelet the API stand-in lacks, played with real processes.

A thread polls the emulator through its HTTP API (as a controller would list/watch) and:

- runs each Deployment replica as a real local process on a loopback address of its own, after its
  init containers (init_containers.py: a failing one shown on a Pending pod, retried after a back-off)
  (127.B.C.N: Linux routes all of 127.0.0.0/8 to `lo`; B.C is this process's block, so that kubelets
  of tests running beside it, `pytest -n`, never share a pod address), so `podIP:containerPort` is
  what it is in a cluster; records a Pod (labels of the template, `status.podIP`, Ready once the template's
  readiness probe passes) and writes the Deployment's status (replicas, updated/ready/available,
  observedGeneration). A changed pod template rolls: the new pod is Ready before an old one stops.
- runs each Job's pod command as a real local process and writes Complete or Failed: exit codes
  matched by a `FailJob` podFailurePolicy rule fail at once, others are retried `backoffLimit`
  times, `activeDeadlineSeconds` kills it; the pod's termination message is the log tail
  (`FallbackToLogsOnError`). A Job deleted and created again under the same name (a rollback to a
  retired revision asks its Jobs anew) is a new Job, run from the start.
- plays the garbage collector: an object whose owner (by uid) is gone is deleted.
- stops a pod as the kubelet does, without holding up the loop: it leaves the API (and so cluster
  DNS) at once, its preStop sleep runs, then SIGTERM, then SIGKILL once terminationGracePeriodSeconds
  have passed. A Deployment's pod deleted through the API (`kubectl delete pod`) is stopped so, and
  replaced.

Translation from a pod to a local process, each the local stand-in of a node fact: `kembed-worker`
is the image's entry point (`python -P -m kembed.worker`), `kembed-gateway` is gateway_entry.py (the
gateway with the stand-in's cluster DNS); a volume is a local directory (hostPath through
`host_paths`, emptyDir a fresh one) and any environment value or argument under a mount path points
into it; `0.0.0.0` (all of the pod's addresses) is the pod IP; an environment value from a
ConfigMap key is read once, when the pod starts (an optional one that is missing is left out). A
Service name `<svc>.<ns>.svc` is resolved as cluster DNS would (cluster_dns.py): by the gateway
itself at each lookup in KEMBED_GATEWAY_WORKER_SERVICE, elsewhere once at pod start, to one of the
ready pods the Service selects (headless). Images, resources, security contexts and node placement
are ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
from cluster_dns import SERVICE_HOST, ready_pod_ips
from gateway_entry import API_URL_ENV
from grpc_health.v1 import health_pb2, health_pb2_grpc
from init_containers import InitContainers

HERE = Path(__file__).resolve().parent
ENTRY_POINTS = {"kembed-worker": "kembed.worker", "kembed-gateway": "gateway_entry"}
# Environment values holding a Service name that the process resolves itself, at each lookup
# (gateway_entry.py), rather than once at pod start.
SELF_RESOLVED_ENV = {"KEMBED_GATEWAY_WORKER_SERVICE"}
# A shared endpoint's models (a JSON list, gateway/endpoint.py): each model_dir is a mounted path,
# each worker_service resolved by the gateway itself, as KEMBED_GATEWAY_WORKER_SERVICE is.
MODELS_ENV = "KEMBED_GATEWAY_MODELS"
TERMINATION_TAIL_BYTES = 2048  # what Kubernetes keeps of the log for FallbackToLogsOnError
DEFAULT_GRACE_S = 30  # terminationGracePeriodSeconds when a pod spec names none
POLL_S = 0.25


@dataclass
class LocalPod:
    name: str
    owner_kind: str  # Deployment or Job
    owner_name: str
    owner_uid: str
    template_hash: str
    ip: str
    container: dict[str, Any]
    popen: subprocess.Popen
    log: Path
    scratch: tempfile.TemporaryDirectory
    grace_s: float = DEFAULT_GRACE_S  # the pod spec's terminationGracePeriodSeconds
    started: float = field(default_factory=time.monotonic)
    is_ready: bool = False
    ready_at: float | None = None  # time.monotonic() its readiness probe first passed
    sigterm_at: float = float("inf")  # while terminating: when SIGTERM is due (after preStop)
    sigkill_at: float = float("inf")  # and when SIGKILL is (terminationGracePeriodSeconds)

    def begin_termination(self) -> None:
        """As the kubelet does on deletion: the preStop sleep, then SIGTERM; SIGKILL once the grace
        period (which the preStop counts against) is over. `reap` carries it on."""
        now = time.monotonic()
        prestop = ((self.container.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
        self.sigterm_at = now + prestop.get("seconds", 0)
        self.sigkill_at = now + self.grace_s
        self.reap()

    def reap(self) -> bool:
        """Signals whatever is due; True (and its scratch space gone) once the process has exited."""
        if self.popen.poll() is None:
            now = time.monotonic()
            if now >= self.sigkill_at:
                self.popen.kill()
            elif now >= self.sigterm_at:
                self.popen.terminate()
                self.sigterm_at = float("inf")  # once
            return False
        self.scratch.cleanup()
        return True

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self.scratch.cleanup()


@dataclass
class JobRun:
    """A Job as the harness saw it run: for the tests' assertions."""

    name: str
    uid: str  # a Job created again under its name is another run
    labels: dict[str, str]
    command: list[str]
    exit_codes: list[int] = field(default_factory=list)
    outcome: str = ""  # Complete or Failed


def pod_network() -> str:
    """The first three octets of this process's pod addresses: a block of 127.0.0.0/8 taken from the
    process id, so that tests on parallel workers (or another checkout's suite on the same host), each
    with pods listening on the same container ports, never bind one address."""
    pid = os.getpid()
    return f"127.{1 + (pid >> 8) % 250}.{pid & 0xFF}"


class LocalKubelet:
    def __init__(self, api_url: str, namespace: str, host_paths: dict[str, Path], log_dir: Path) -> None:
        self._api = httpx.Client(base_url=api_url, timeout=10)
        self._ns = namespace
        self._host_paths = host_paths
        self._log_dir = log_dir
        self._api_url = api_url
        self._pods: dict[str, LocalPod] = {}
        self._terminating: list[LocalPod] = []  # gone from the API, their processes stopping
        self._ips = (f"{pod_network()}.{i}" for i in itertools.count(10))
        self._names = itertools.count(1)
        self._dns_turn = 0
        self.jobs: dict[str, JobRun] = {}  # the latest run of each Job name
        self.job_runs: list[JobRun] = []  # every run, in order (a name may come back)
        self.errors: list[str] = []
        self._inits = InitContainers(self._api, namespace, log_dir, ENTRY_POINTS, self.errors)
        self.init_runs = self._inits.runs  # (owner, init container, exit code)
        self.is_holding_jobs = threading.Event()  # set: Jobs stay pending, as if no node had room
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="local-kubelet", daemon=True)

    # --- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> LocalKubelet:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for pod in [*self._pods.values(), *self._terminating]:
            pod.stop()
        self._api.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as error:  # the test reads these; the loop must go on
                self.errors.append(repr(error))
            self._stop.wait(POLL_S)

    def pods_of(self, owner_name: str) -> list[LocalPod]:
        return [p for p in self._pods.values() if p.owner_name == owner_name]

    # --- API helpers ------------------------------------------------------------------------------

    def _items(self, prefix: str, plural: str) -> list[dict[str, Any]]:
        answer = self._api.get(f"{prefix}/namespaces/{self._ns}/{plural}")
        answer.raise_for_status()
        return answer.json()["items"]

    def _patch_status(self, prefix: str, plural: str, name: str, status: dict[str, Any]) -> None:
        self._api.patch(
            f"{prefix}/namespaces/{self._ns}/{plural}/{name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    def _delete(self, prefix: str, plural: str, name: str) -> None:
        self._api.delete(f"{prefix}/namespaces/{self._ns}/{plural}/{name}")

    # --- one pass ---------------------------------------------------------------------------------

    def sync(self) -> None:
        self._collect_garbage()
        self._sync_deleted_pods()
        self._sync_deployments()
        self._sync_jobs()
        self._terminating = [p for p in self._terminating if not p.reap()]

    def _collect_garbage(self) -> None:
        kinds = [
            ("/apis/kembed.dev/v1alpha1", "embeddingmodels"),
            ("/apis/apps/v1", "deployments"),
            ("/apis/batch/v1", "jobs"),
            ("/api/v1", "services"),
            ("/api/v1", "configmaps"),
            ("/api/v1", "pods"),
            ("/apis/policy/v1", "poddisruptionbudgets"),
            ("/apis/networking.k8s.io/v1", "networkpolicies"),
        ]
        listed = {kind: self._items(*kind) for kind in kinds}
        uids = {o["metadata"]["uid"] for items in listed.values() for o in items}
        for (prefix, plural), items in listed.items():
            for obj in items:
                owners = obj["metadata"].get("ownerReferences") or []
                if owners and not any(o["uid"] in uids for o in owners):
                    self._delete(prefix, plural, obj["metadata"]["name"])

    def _sync_deleted_pods(self) -> None:
        """A Deployment's pod deleted through the API is stopped (its ReplicaSet then replaces it).
        Every pod run here was created in the API in an earlier pass, so one not listed was deleted."""
        listed = {p["metadata"]["name"] for p in self._items("/api/v1", "pods")}
        for pod in [p for p in self._pods.values() if p.owner_kind == "Deployment"]:
            if pod.name not in listed:
                self._terminate(pod)

    # --- Deployments ------------------------------------------------------------------------------

    def _sync_deployments(self) -> None:
        deployments = {d["metadata"]["name"]: d for d in self._items("/apis/apps/v1", "deployments")}
        self._inits.keep({(name, _template_hash(d)) for name, d in deployments.items()})
        for pod in [p for p in self._pods.values() if p.owner_kind == "Deployment"]:
            live = deployments.get(pod.owner_name)
            if live is None or live["metadata"]["uid"] != pod.owner_uid:
                self._remove(pod)
        for deployment in deployments.values():
            self._sync_deployment(deployment)

    def _sync_deployment(self, deployment: dict[str, Any]) -> None:
        name, spec = deployment["metadata"]["name"], deployment["spec"]
        want = spec.get("replicas", 1)
        template_hash = _template_hash(deployment)
        for pod in self.pods_of(name):
            if pod.popen.poll() is not None:  # crashed: the ReplicaSet replaces it
                self.errors.append(f"pod {pod.name} exited with {pod.popen.returncode}: {pod.log}")
                self._remove(pod)
        current = [p for p in self.pods_of(name) if p.template_hash == template_hash]
        old = [p for p in self.pods_of(name) if p.template_hash != template_hash]
        for pod in current[want:]:
            self._remove(pod)
        current = current[:want]
        for _ in range(want - len(current)):
            pod = self._start(deployment, "Deployment", template_hash, name)
            if pod is None:
                break  # a Service name did not resolve yet: try on the next pass
            current.append(pod)
        for pod in current:
            if not pod.is_ready and self._probe(pod):
                pod.is_ready, pod.ready_at = True, time.monotonic()
                self._write_pod(pod, deployment["spec"]["template"], phase="Running", is_ready=True)
        num_ready = sum(p.is_ready for p in current)
        if num_ready >= want:
            for pod in old:
                self._remove(pod)
            old = []
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(current) + len(old),
            "updatedReplicas": len(current),
            "readyReplicas": num_ready + sum(p.is_ready for p in old),
            "availableReplicas": num_ready + sum(p.is_ready for p in old),
        }
        if {k: deployment.get("status", {}).get(k) for k in status} != status:
            self._patch_status("/apis/apps/v1", "deployments", name, status)

    # --- Jobs -------------------------------------------------------------------------------------

    def _sync_jobs(self) -> None:
        jobs = {j["metadata"]["name"]: j for j in self._items("/apis/batch/v1", "jobs")}
        for pod in [p for p in self._pods.values() if p.owner_kind == "Job"]:
            live = jobs.get(pod.owner_name)
            if live is None or live["metadata"]["uid"] != pod.owner_uid:
                self._remove(pod)
        for job in jobs.values():
            conditions = job.get("status", {}).get("conditions", [])
            if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions):
                continue
            self._sync_job(job)

    def _sync_job(self, job: dict[str, Any]) -> None:
        name, spec, uid = job["metadata"]["name"], job["spec"], job["metadata"]["uid"]
        run = self.jobs.get(name)
        if run is None or run.uid != uid:  # the runs of a Job deleted since are not this one's
            labels = dict(job["metadata"].get("labels", {}))
            run = JobRun(name, uid, labels, spec["template"]["spec"]["containers"][0]["command"])
            self.jobs[name] = run
            self.job_runs.append(run)
        pods = self.pods_of(name)
        if not pods and self.is_holding_jobs.is_set():
            return
        if len(run.exit_codes) == len(pods):  # no pod yet, or every one has been accounted for
            self._start(job, "Job", "", name)  # None (a ConfigMap missing): the next pass tries again
            return
        deadline = spec.get("activeDeadlineSeconds")
        if any(p.popen.poll() is None for p in pods):
            if deadline is not None and time.monotonic() - min(p.started for p in pods) > deadline:
                for pod in pods:
                    pod.stop()
                message = "Job was active longer than specified deadline"
                self._finish(job, run, "Failed", "DeadlineExceeded", message)
            return
        pod = max(self.pods_of(name), key=lambda p: p.started)
        code = pod.popen.returncode
        run.exit_codes.append(code)
        message = ""
        written = Path(pod.scratch.name) / "termination-log"  # the container's terminationMessagePath
        if written.is_file() and written.read_text().strip():
            message = written.read_text()[-4096:]
        elif code != 0:
            with pod.log.open("rb") as log:
                log.seek(0, 2)
                log.seek(max(0, log.tell() - TERMINATION_TAIL_BYTES))
                message = log.read().decode(errors="replace")
        self._write_pod(
            pod,
            spec["template"],
            phase="Succeeded" if code == 0 else "Failed",
            exit_code=code,
            message=message,
        )
        if code == 0:
            self._finish(job, run, "Complete", "", "")
            return
        container = pod.container["name"]
        for index, rule in enumerate(spec.get("podFailurePolicy", {}).get("rules", [])):
            on = rule.get("onExitCodes", {})
            if rule.get("action") == "FailJob" and on.get("containerName", container) == container:
                matched = (
                    code in on.get("values", [])
                    if on.get("operator") == "In"
                    else code not in on.get("values", [])
                )
                if matched:
                    text = (
                        f"Container {container} for pod {self._ns}/{pod.name} failed with exit code {code} "
                        f"matching FailJob rule at index {index}"
                    )
                    self._finish(job, run, "Failed", "PodFailurePolicy", text)
                    return
        if len(run.exit_codes) > spec.get("backoffLimit", 6):
            self._finish(
                job, run, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
            )
            return
        self._start(job, "Job", "", name)

    def _finish(self, job: dict[str, Any], run: JobRun, outcome: str, reason: str, message: str) -> None:
        run.outcome = outcome
        condition = {"type": outcome, "status": "True", "reason": reason, "message": message}
        counts = {"succeeded": 1} if outcome == "Complete" else {"failed": len(run.exit_codes) or 1}
        self._patch_status(
            "/apis/batch/v1", "jobs", job["metadata"]["name"], {"conditions": [condition], **counts}
        )

    # --- pods -------------------------------------------------------------------------------------

    def _start(
        self, owner: dict[str, Any], owner_kind: str, template_hash: str, owner_name: str
    ) -> LocalPod | None:
        template = owner["spec"]["template"]
        pod_spec = template["spec"]
        container = pod_spec["containers"][0]
        scratch = self._inits.scratch_for(owner_name, template_hash)
        ip = next(self._ips)
        mounts = self._mounts(pod_spec, container, Path(scratch.name))
        termination_log = Path(scratch.name) / "termination-log"
        mounts[container.get("terminationMessagePath", "/dev/termination-log")] = termination_log
        pod_name = self._inits.run(
            owner,
            template_hash,
            scratch,
            lambda init: self._mounts(pod_spec, init, Path(scratch.name)),
            lambda value, init_mounts: self._translate(value, init_mounts, "127.0.0.1"),
            lambda: f"{owner_name}-{next(self._names)}",
        )
        if pod_name is None:
            return None  # failed (shown on the pod, its volumes kept) or backing off: a later pass
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            name = source["configMapRef"]["name"]
            answer = self._api.get(f"/api/v1/namespaces/{self._ns}/configmaps/{name}")
            if answer.status_code != 200:
                self._release(scratch, owner_name, template_hash)
                return None  # the kubelet waits for the ConfigMap
            env.update(answer.json().get("data", {}))
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
                continue
            ref = (item.get("valueFrom") or {}).get("configMapKeyRef")
            if ref is None:
                raise NotImplementedError(f"env {item['name']}: only values and configMapKeyRef are played")
            answer = self._api.get(f"/api/v1/namespaces/{self._ns}/configmaps/{ref['name']}")
            value = (answer.json().get("data") or {}).get(ref["key"]) if answer.status_code == 200 else None
            if value is not None:
                env[item["name"]] = value  # read once, at container start, as the kubelet does
            elif not ref.get("optional"):
                self._release(scratch, owner_name, template_hash)
                return None  # the kubelet waits for the ConfigMap and its key
        try:
            env = {
                k: self._translate_models(v, mounts, ip)
                if k == MODELS_ENV
                else self._translate(v, mounts, ip, is_dns_kept=k in SELF_RESOLVED_ENV)
                for k, v in env.items()
            }
            args = [self._translate(a, mounts, ip) for a in container["command"] + container.get("args", [])]
        except LookupError:
            self._release(scratch, owner_name, template_hash)
            return None
        if args[0] in ENTRY_POINTS:
            args = [sys.executable, "-P", "-m", ENTRY_POINTS[args[0]], *args[1:]]
        # PYTHONPATH: gateway_entry and cluster_dns live beside this file, before whatever the tests
        # run with (so that pods run the code under test, not only an installed copy); the API is
        # the pod's DNS.
        path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
        env |= {"PATH": str(Path(sys.executable).parent), "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        env[API_URL_ENV] = self._api_url
        log = self._log_dir / f"{pod_name}.log"
        with log.open("w") as out:
            popen = subprocess.Popen(
                args, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        pod = LocalPod(
            pod_name,
            owner_kind,
            owner_name,
            owner["metadata"]["uid"],
            template_hash,
            ip,
            container,
            popen,
            log,
            scratch,
            pod_spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S),
        )
        self._pods[pod_name] = pod
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self._ns,
                "labels": dict(template["metadata"].get("labels", {})),
                # a ReplicaSet copies the template's annotations too (the gateway's revision is one)
                "annotations": dict(template["metadata"].get("annotations", {})),
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner_kind,
                        "name": owner_name,
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": pod_spec,
        }
        self._api.post(f"/api/v1/namespaces/{self._ns}/pods", json=body)
        self._write_pod(pod, template, phase="Running" if owner_kind == "Job" else "Pending", is_ready=False)
        return pod

    def _release(self, scratch: tempfile.TemporaryDirectory, owner_name: str, template_hash: str) -> None:
        """A pod not started after all (a ConfigMap or a Service missing): its volumes go, unless they
        are a failing pod's, which keeps them."""
        if not self._inits.is_failing(owner_name, template_hash):
            scratch.cleanup()

    def _write_pod(
        self,
        pod: LocalPod,
        template: dict[str, Any],
        phase: str,
        is_ready: bool = False,
        exit_code: int | None = None,
        message: str = "",
    ) -> None:
        state: dict[str, Any] = {"running": {}}
        if exit_code is not None:
            state = {
                "terminated": {
                    "exitCode": exit_code,
                    "message": message,
                    "reason": "Completed" if exit_code == 0 else "Error",
                }
            }
        status = {
            "phase": phase,
            "podIP": pod.ip,
            "conditions": [{"type": "Ready", "status": "True" if is_ready else "False"}],
            "containerStatuses": [{"name": pod.container["name"], "ready": is_ready, "state": state}],
        }
        self._patch_status("/api/v1", "pods", pod.name, status)

    def _remove(self, pod: LocalPod) -> None:
        """Delete it from the API (its endpoint, and so its DNS record, goes at once) and stop it."""
        self._delete("/api/v1", "pods", pod.name)
        self._terminate(pod)

    def _terminate(self, pod: LocalPod) -> None:
        self._pods.pop(pod.name, None)
        pod.begin_termination()
        self._terminating.append(pod)

    def _mounts(self, pod_spec: dict[str, Any], container: dict[str, Any], scratch: Path) -> dict[str, Path]:
        volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
        mounts = {}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                local = self._host_paths[volume["hostPath"]["path"]]
            elif "emptyDir" in volume:
                local = scratch / mount["name"]
                local.mkdir(exist_ok=True)  # one volume, seen by the init containers and the main one
            else:
                raise NotImplementedError(f"volume {volume}: only hostPath and emptyDir are played")
            mounts[mount["mountPath"]] = local / mount.get("subPath", "")
        return mounts

    def _translate_models(self, value: str, mounts: dict[str, Path], ip: str) -> str:
        models = json.loads(value)
        for model in models:
            model["model_dir"] = self._translate(model["model_dir"], mounts, ip, is_dns_kept=True)
        return json.dumps(models)

    def _translate(self, value: str, mounts: dict[str, Path], ip: str, is_dns_kept: bool = False) -> str:
        for path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value == path or value.startswith(path + "/"):
                return str(local) + value[len(path) :]
        value = value.replace("0.0.0.0", ip)
        return value if is_dns_kept else SERVICE_HOST.sub(self._resolve, value)

    def _resolve(self, match: re.Match) -> str:
        """Cluster DNS for a headless Service, once: one of its ready pods' IPs, spread over repeats."""
        service, namespace = match.group(1), match.group(2)
        ips = ready_pod_ips(self._api, service, namespace)
        if not ips:
            raise LookupError(service)
        self._dns_turn += 1
        return ips[self._dns_turn % len(ips)]

    def _probe(self, pod: LocalPod) -> bool:
        probe = pod.container.get("readinessProbe") or {}
        ports = {p["name"]: p["containerPort"] for p in pod.container.get("ports", [])}
        if "tcpSocket" in probe:
            port = probe["tcpSocket"]["port"]
            with contextlib.suppress(OSError), socket.create_connection((pod.ip, ports.get(port, port)), 1):
                return True
            return False
        if "grpc" in probe:  # the standard health check, as the kubelet's gRPC probe sends it
            address = f"{pod.ip}:{probe['grpc']['port']}"
            request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
            try:
                with grpc.insecure_channel(address) as channel:
                    answer = health_pb2_grpc.HealthStub(channel).Check(request, timeout=1)
            except grpc.RpcError:
                return False
            return answer.status == health_pb2.HealthCheckResponse.SERVING
        if "httpGet" in probe:
            port = probe["httpGet"]["port"]
            url = f"http://{pod.ip}:{ports.get(port, port)}{probe['httpGet'].get('path', '/')}"
            try:
                return httpx.get(url, timeout=2).status_code == 200
            except httpx.TransportError:
                return False
        return pod.popen.poll() is None


def _template_hash(owner: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(owner["spec"]["template"], sort_keys=True).encode()).hexdigest()[:10]
