"""An in-memory stand-in for the few API calls the operator makes, and helpers playing the
controllers it relies on (Deployment pods becoming ready, Jobs finishing, the gateway rolling)."""

from __future__ import annotations

import base64
import copy
import json
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from kembed.operator.build import naming as n
from kembed.operator.cluster.rbac import allows
from kembed.operator.cluster.reconcile import Images, ReconcileHooks, reconcile
from kembed.operator.rollout import golden

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "charts" / "kembed" / "examples"


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def model_body(spec: dict[str, Any], name: str = "minilm", generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "kembed.dev/v1alpha1",
        "kind": "EmbeddingModel",
        "metadata": {"name": name, "namespace": "ml", "uid": "uid-1", "generation": generation},
        "spec": copy.deepcopy(spec),
    }


def merge_patch(value: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, null removes, anything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(value) if isinstance(value, dict) else {}
    for key, item in patch.items():
        if item is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), item)
    return out


class FakeCluster:
    """Objects by (kind, namespace, name); every call checked against RBAC_RULES and recorded."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.unserved: set[str] = set()  # kinds whose CRD is not installed
        # What a golden Job answers, played at once when it is created: its pod's log (None: the Job
        # stays running until `finish_job("golden", ...)`). By default the same answer every time.
        self.golden_log: str | None = golden_log()
        self.logs: dict[str, str] = {}  # pod name -> log

    def _record(self, verb: str, kind: str) -> None:
        assert allows(verb, kind), f"RBAC_RULES do not allow {verb} on {kind}"
        self.calls.append((verb, kind))

    def get(self, kind, namespace, name):
        self._record("get", kind)
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found)

    def list(self, kind, namespace, labels):
        self._record("list", kind)
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in sorted(self.objects.items())
            if k == kind
            and ns == namespace
            and all(o["metadata"].get("labels", {}).get(a) == b for a, b in labels.items())
        ]

    def serves(self, kind, namespace):
        """Every kind is served (KEDA installed, say); `unserved` lists those that are not."""
        self._record("list", kind)
        return kind not in self.unserved

    def create(self, body):
        self._record("create", body["kind"])
        meta = body["metadata"]
        key = (body["kind"], meta["namespace"], meta["name"])
        assert key not in self.objects, f"{key} exists"
        stored = copy.deepcopy(body)
        stored["metadata"]["generation"] = 1
        self.objects[key] = stored
        is_golden = body["kind"] == "Job" and meta["labels"][n.COMPONENT_LABEL] == "golden"
        if is_golden and self.golden_log is not None:
            self.finish_job("golden", True, log=self.golden_log)

    def pod_log(self, namespace, name, container):
        self._record("get", "PodLog")
        return self.logs.get(name) if ("Pod", namespace, name) in self.objects else None

    def patch(self, kind, namespace, name, body):
        self._record("patch", kind)
        live = self.objects[(kind, namespace, name)]
        generation = live["metadata"]["generation"]
        status = live.get("status")
        # A JSON merge patch, as the API server applies it: what the patch leaves out stays, null
        # removes (our patches carry whole bodies, plus nulls for fields the body no longer has).
        merged = merge_patch({k: v for k, v in live.items() if k != "status"}, body)
        merged["metadata"]["generation"] = generation + (merged.get("spec") != live.get("spec"))
        if status is not None:
            merged["status"] = status
        self.objects[(kind, namespace, name)] = merged

    def delete(self, kind, namespace, name):
        self._record("delete", kind)
        self.objects.pop((kind, namespace, name), None)
        if kind == "Deployment":  # play the ReplicaSet controller: its pods go with it
            for key in [k for k, o in self.objects.items() if k[0] == "Pod" and o.get("_owner") == name]:
                del self.objects[key]

    def delete_if_present(self, kind, namespace, name):
        """As the API server sees it: a get, and a delete when found (KubeCluster also skips objects
        it has seen absent; that memory is tested on its own)."""
        if self.get(kind, namespace, name) is not None:
            self.delete(kind, namespace, name)

    def event(self, owner, type_, reason, message):
        self._record("create", "Event")
        self.events.append((type_, reason, message))

    # --- playing the controllers ----------------------------------------------------------------

    def named(self, kind: str, component: str, revision: str | None = None) -> list[dict[str, Any]]:
        return [
            o
            for (k, _, _), o in sorted(self.objects.items())
            if k == kind
            and o["metadata"]["labels"].get(n.COMPONENT_LABEL) == component
            and (revision is None or o["metadata"]["labels"].get(n.REVISION_LABEL) == revision)
        ]

    def run_workers(
        self, revision: str, ready: bool = True, ip_base: int = 10, image_ids: tuple[str, ...] = ()
    ) -> None:
        """The worker Deployment of `revision` gets its pods (ready or not); pod i reports running
        image_ids[i] (none reported when not given)."""
        (deployment,) = self.named("Deployment", "worker", revision)
        name = deployment["metadata"]["name"]
        for key in [k for k, o in self.objects.items() if k[0] == "Pod" and o.get("_owner") == name]:
            del self.objects[key]
        for i in range(deployment["spec"]["replicas"]):
            pod_name = f"{name}-{i}"
            self.objects[("Pod", "ml", pod_name)] = {
                "_owner": name,
                "metadata": {
                    "name": pod_name,
                    "labels": deployment["spec"]["template"]["metadata"]["labels"],
                },
                "status": {
                    "podIP": f"10.0.{ip_base}.{i + 1}",
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                },
            }
            if i < len(image_ids):
                self.objects[("Pod", "ml", pod_name)]["status"]["containerStatuses"] = [
                    {"name": "worker", "imageID": image_ids[i]}
                ]

    def finish_job(
        self, component: str, succeeded: bool, report: str = "", seconds: float = 42, log: str = ""
    ) -> str:
        """The one unfinished Job of `component` (prewarm, smoke or golden) ends after `seconds`; its
        name. A succeeded one's pod has `log` as its log."""
        (job,) = [j for j in self.named("Job", component) if "conditions" not in j.get("status", {})]
        started = datetime(2026, 1, 1, tzinfo=UTC)
        ended = (started + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
        condition = {
            "type": "Complete" if succeeded else "Failed",
            "status": "True",
            "lastTransitionTime": ended,
        }
        if not succeeded:
            condition |= {"reason": "PodFailurePolicy", "message": "container exited with 1"}
            pod_name = job["metadata"]["name"] + "-x"
            self.objects[("Pod", "ml", pod_name)] = {
                "metadata": {"name": pod_name, "labels": job["spec"]["template"]["metadata"]["labels"]},
                "status": {
                    "containerStatuses": [{"state": {"terminated": {"exitCode": 1, "message": report}}}]
                },
            }
        job["status"] = {"conditions": [condition], "startTime": started.isoformat().replace("+00:00", "Z")}
        if succeeded:
            job["status"]["completionTime"] = ended
            pod_name = job["metadata"]["name"] + "-ok"
            self.objects[("Pod", "ml", pod_name)] = {
                "metadata": {"name": pod_name, "labels": job["spec"]["template"]["metadata"]["labels"]},
                "status": {"phase": "Succeeded"},
            }
            self.logs[pod_name] = log
        return job["metadata"]["name"]

    def roll_gateway(self, components: tuple[str, ...] = ("gateway", n.BULK_GATEWAY)) -> None:
        """The gateway Deployment's pods (and the bulk gateway's, if there is one) all run its current
        template and are available."""
        for component in components:
            found = self.named("Deployment", component)
            assert found or component != "gateway", "no gateway Deployment to roll"
            for deployment in found:
                replicas = deployment["spec"]["replicas"]
                deployment["status"] = {
                    "observedGeneration": deployment["metadata"]["generation"],
                    "replicas": replicas,
                    "updatedReplicas": replicas,
                    "availableReplicas": replicas,
                    "readyReplicas": replicas,
                }


def golden_log(
    weights: str = "ab" * 32,
    rows: tuple[tuple[float, ...], ...] = ((1.0, 0.0), (0.6, 0.8)),
    prompted: dict[str, tuple[tuple[float, ...], ...]] | None = None,
) -> str:
    """A golden Job's log: a report line and the record line (kembed.gateway.golden's format; of
    version 1, raw rows, unless `prompted` is given: version 2, rows as clients get them)."""

    def encoded(block: tuple[tuple[float, ...], ...]) -> list[str]:
        return [base64.b64encode(struct.pack(f"<{len(r)}f", *r)).decode() for r in block]

    record = {
        "version": 1 if prompted is None else 2,
        "weights": f"sha256:{weights}",
        "task": "embed",
        "textsSha256": "t" * 64,
        "modelType": "bert",
        "rows": encoded(rows),
        "columns": len(rows[0]),
    }
    if prompted is not None:
        record["prompted"] = {name: encoded(block) for name, block in prompted.items()}
    return f"ok   golden 10.0.0.1:50051: {len(rows)} rows\n{golden.RECORD_PREFIX}{json.dumps(record)}\n"


IMAGES = Images(worker="registry.test/kembed/worker:1", gateway="registry.test/kembed/gateway:1")


class Driver:
    """Plays the API server's copy of one EmbeddingModel across reconcile passes."""

    def __init__(self, spec: dict, hooks: ReconcileHooks | None = None) -> None:
        self.hooks = hooks
        self.cluster = FakeCluster()
        self.body = model_body(spec)
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def step(self, seconds: float = 5) -> dict:
        self.now += timedelta(seconds=seconds)
        status = reconcile(self.cluster, copy.deepcopy(self.body), IMAGES, self.now, self.hooks)
        self.body["status"] = json.loads(json.dumps(status))  # stored, and read back, as JSON
        return self.body["status"]

    def edit(self, section: str, **fields) -> None:
        self.body["spec"].setdefault(section, {}).update(fields)
        self.body["metadata"]["generation"] += 1

    def condition(self, type_: str) -> dict:
        return next(c for c in self.body["status"]["conditions"] if c["type"] == type_)

    def pass_gates(self, revision: str, ip_base: int = 20) -> None:
        """Candidate `revision`'s pods up, its prewarm and smoke Jobs passed: it is Promoting (a gateway
        rolled to it); each a reconcile pass."""
        self.cluster.run_workers(revision, ip_base=ip_base)
        self.step()
        self.cluster.finish_job("prewarm", True)
        self.step()
        self.cluster.finish_job("smoke", True)
        self.step()

    def promote(self) -> str:
        """Drive the candidate through the gate to serving; its revision."""
        revision = self.step()["candidateRevision"]
        self.cluster.run_workers(revision)
        assert self.step()["rollout"]["stage"] == "Prewarming"
        self.cluster.finish_job("prewarm", True)
        assert self.step()["rollout"]["stage"] == "SmokeTesting"
        self.cluster.finish_job("smoke", True)
        assert self.step()["rollout"]["stage"] == "Promoting"
        self.cluster.roll_gateway()
        assert self.step()["activeRevision"] == revision
        return revision
