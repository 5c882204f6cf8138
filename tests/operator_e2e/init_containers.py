"""A Deployment pod's init containers as the kubelet runs them, for local_kubelet.py: each run to its
end as a real local process before the pod's container starts (the pod's volumes shared), and a
failing one shown as the kubelet shows it: the pod in the API, Pending, its `initContainerStatuses`
holding the failed run (exit code and termination message: what the operator's ModelFetchFailed reads)
and a `restartCount`, the run tried again after a back-off (1 s doubling to 8 s here; the kubelet's
is 10 s doubling to 5 min), never at every pass of the loop. Once the init containers pass, the same
pod name goes on to run its container.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

MAX_BACKOFF_S = 8.0
INIT_TIMEOUT_S = 300


@dataclass
class Failing:
    """A pod whose init container failed: its name in the API, its volumes (an emptyDir outlives
    its init containers' restarts: a fetch resumes), how often, when to try again."""

    name: str
    scratch: tempfile.TemporaryDirectory
    num_restarts: int = 0
    retry_at: float = 0.0


class InitContainers:
    def __init__(
        self,
        api: httpx.Client,
        namespace: str,
        log_dir: Path,
        entry_points: dict[str, str],
        errors: list[str],
    ) -> None:
        self._api, self._ns, self._log_dir = api, namespace, log_dir
        self._entry_points = entry_points
        self._errors = errors  # the kubelet's: the tests read them
        self._failing: dict[tuple[str, str], Failing] = {}  # (owner, template hash) -> its pod
        self.runs: list[tuple[str, str, int]] = []  # (owner, init container, exit code)

    def scratch_for(self, owner_name: str, template_hash: str) -> tempfile.TemporaryDirectory:
        """The pod's volumes: a failing pod's own, else new ones."""
        failing = self._failing.get((owner_name, template_hash))
        return failing.scratch if failing is not None else tempfile.TemporaryDirectory(prefix="pod-")

    def run(
        self,
        owner: dict[str, Any],
        template_hash: str,
        scratch: tempfile.TemporaryDirectory,
        mounts_of: Callable[[dict[str, Any]], dict[str, Path]],
        translate: Callable[[str, dict[str, Path]], str],
        new_name: Callable[[], str],
    ) -> str | None:
        """The pod's name once every init container passed (the failing pod's own, if there was
        one), or None: one failed (recorded on the pod, whose volumes are kept) or is backing off."""
        owner_name = owner["metadata"]["name"]
        key = (owner_name, template_hash)
        failing = self._failing.get(key)
        if failing is not None and time.monotonic() < failing.retry_at:
            return None
        for init in owner["spec"]["template"]["spec"].get("initContainers", []):
            code, message = self._run_one(init, Path(scratch.name), owner_name, mounts_of, translate)
            if code != 0:
                self._record(owner, key, scratch, init["name"], code, message, new_name)
                return None
        if failing is None:
            return new_name()
        del self._failing[key]
        self._api.delete(f"/api/v1/namespaces/{self._ns}/pods/{failing.name}")  # made again, running
        return failing.name

    def is_failing(self, owner_name: str, template_hash: str) -> bool:
        return (owner_name, template_hash) in self._failing

    def keep(self, live: set[tuple[str, str]]) -> None:
        """Failing pods of a Deployment gone, or of an older template of one: deleted."""
        for key in [k for k in self._failing if k not in live]:
            failing = self._failing.pop(key)
            self._api.delete(f"/api/v1/namespaces/{self._ns}/pods/{failing.name}")
            failing.scratch.cleanup()

    def _run_one(
        self,
        init: dict[str, Any],
        scratch: Path,
        owner_name: str,
        mounts_of: Callable[[dict[str, Any]], dict[str, Path]],
        translate: Callable[[str, dict[str, Path]], str],
    ) -> tuple[int, str]:
        mounts = mounts_of(init)
        report = scratch / f"termination-log-{init['name']}"
        report.unlink(missing_ok=True)  # a message is the run's own, never an earlier run's
        mounts[init.get("terminationMessagePath", "/dev/termination-log")] = report
        env = {
            item["name"]: translate(item["value"], mounts) for item in init.get("env", []) if "value" in item
        }
        args = [translate(a, mounts) for a in init["command"] + init.get("args", [])]
        if args[0] in self._entry_points:
            args = [sys.executable, "-P", "-m", self._entry_points[args[0]], *args[1:]]
        env |= {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        log = self._log_dir / f"{owner_name}-{init['name']}-{len(self.runs)}.log"
        with log.open("w") as out:
            run = subprocess.run(args, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=INIT_TIMEOUT_S)
        self.runs.append((owner_name, init["name"], run.returncode))
        message = report.read_text() if report.exists() else ""
        if run.returncode != 0:
            if not message.strip():  # FallbackToLogsOnError: the log's tail
                message = log.read_text()[-2048:]
            self._errors.append(
                f"init container {init['name']} of {owner_name} exited {run.returncode}: {message} {log}"
            )
        return run.returncode, message

    def _record(
        self,
        owner: dict[str, Any],
        key: tuple[str, str],
        scratch: tempfile.TemporaryDirectory,
        init_name: str,
        code: int,
        message: str,
        new_name: Callable[[], str],
    ) -> None:
        failing = self._failing.get(key)
        if failing is None:
            failing = self._failing[key] = Failing(new_name(), scratch)
            self._create(owner, failing.name)
        else:
            failing.num_restarts += 1
        failing.retry_at = time.monotonic() + min(MAX_BACKOFF_S, 2.0**failing.num_restarts)
        container = owner["spec"]["template"]["spec"]["containers"][0]["name"]
        status = {
            "phase": "Pending",
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "False"}],
            "initContainerStatuses": [
                {
                    "name": init_name,
                    "ready": False,
                    "restartCount": failing.num_restarts,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": code, "reason": "Error", "message": message}},
                }
            ],
            "containerStatuses": [
                {"name": container, "ready": False, "state": {"waiting": {"reason": "PodInitializing"}}}
            ],
        }
        self._api.patch(
            f"/api/v1/namespaces/{self._ns}/pods/{failing.name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    def _create(self, owner: dict[str, Any], name: str) -> None:
        template = owner["spec"]["template"]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self._ns,
                "labels": dict(template["metadata"].get("labels", {})),
                "annotations": dict(template["metadata"].get("annotations", {})),
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner.get("kind", "Deployment"),
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": template["spec"],
        }
        self._api.post(f"/api/v1/namespaces/{self._ns}/pods", json=body)
