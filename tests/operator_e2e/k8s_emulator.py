"""`Emulator`: kmock's `KubernetesEmulator` made to carry a real kopf operator, kubectl and the client.

kmock 0.8 keeps its HTTP server, its discovery (a bundled k3s dump) and its `Status` error format;
this subclass takes over the object requests (paths at or below a resource's plural), because the
gaps that /work/shared/K8S_TESTING.md lists sit on that path. Fixed here: listing cluster-scoped
resources (`GET /api/v1/namespaces`); `resourceVersion`, `uid`, `generation` (bumped when anything
but metadata/status changes) and `creationTimestamp`; 422 for a failed JSON-patch `test`; watches
that resume after `?resourceVersion=` and end at `timeoutSeconds`; 201 on create; typed lists with
their own resourceVersion; `application/json` watch streams; a CRD registering its resource for
discovery at once and reading Established; core discovery saying `v1`, not `/v1`; the status
subresource (a main-endpoint write keeps the old `status`, a `/status` write changes only
`status`); a server-side apply (`kubectl apply --server-side`) of a missing object creates it.

Still not emulated: field ownership of server-side apply (an apply onto an existing object is a
merge patch), strategic merge (also a merge patch), label/field selectors (the operator filters its
lists itself), CRD schema validation and defaults, CEL rules, PUT, protobuf bodies (415, so kubectl
can create only custom resources and CRDs), the `initial-events-end` bookmark (`kubectl wait`), RBAC
and admission. The controllers and the garbage collector are the harness's (`local_kubelet.py`), and
so are pods' logs (`pods/<name>/log` reads the file the local kubelet writes).
"""

from __future__ import annotations

import asyncio
import copy
import gzip
import importlib.resources
import json
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import yaml
from kmock import KubernetesEmulator, KubernetesError, ResourceInfo, Server, resource

Key = tuple[str, str, str, str]  # (group/version, plural, namespace or "", name)
WITH_STATUS = {"deployments", "jobs", "pods", "services", "namespaces"}  # built-ins with /status


def merge_patch(value: Any, patch: Any) -> Any:
    """RFC 7386: dicts merge, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(value) if isinstance(value, dict) else {}
    for key, item in patch.items():
        if item is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), item)
    return out


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _split(path: str) -> tuple[str, str, str, str, str] | None:
    """`/api/v1/...` or `/apis/g/v/...` below the plural → (gv, plural, namespace, name, subresource)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        gv, rest = parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    return gv, rest[0], namespace, rest[1] if len(rest) > 1 else "", "/".join(rest[2:])


@attrs.define(kw_only=True)
class Emulator(KubernetesEmulator):
    """An in-memory API server for one test: objects, watches, CRDs. Thread-safe readers via `snapshot`."""

    _store: dict[Key, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _log: list[tuple[int, Key, str, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _version: int = attrs.field(default=1, init=False)
    _changed: asyncio.Condition | None = attrs.field(default=None, init=False)
    _kinds: dict[tuple[str, str], str] = attrs.field(factory=dict, init=False)
    _with_status: set[tuple[str, str]] = attrs.field(factory=set, init=False)
    # Where the local kubelet writes each pod's log (`<pod name>.log`): `GET pods/<name>/log` reads it.
    pod_log_dir: Path | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # kmock's own load_bundled() uses a deprecated importlib call (warnings are errors here).
        bundled = importlib.resources.files("kmock._internal") / "resources.json.gz"
        self.resources.load_data(gzip.decompress(bundled.read_bytes()))
        for res in self.resources:
            info = self.resources[res]
            gv = f"{res.group}/{res.version}" if res.group else res.version
            self._kinds[(gv, res.plural)] = info.kind or ""
            if "status" in info.subresources or res.plural in WITH_STATUS:
                self._with_status.add((gv, res.plural))

    async def _serve_version(self, request: Any) -> Any:
        answer = await super()._serve_version(request)
        answer["groupVersion"] = answer["groupVersion"].lstrip("/")  # the core group is "v1", not "/v1"
        for entry in answer["resources"]:
            if "/" in entry["name"]:  # a subresource has no short names (kubectl warns of ambiguity)
                entry["shortNames"] = []
        return answer

    # --- requests ---------------------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        where = _split(raw.path)
        if where is None:
            return await super().__call__(raw)  # discovery and the rest: kmock's own
        if self._changed is None:
            self._changed = asyncio.Condition()
        try:
            return await self._serve(raw, *where)
        except KubernetesError as error:
            return await self._render_error(error)

    async def _serve(
        self, raw: aiohttp.web.BaseRequest, gv: str, plural: str, ns: str, name: str, sub: str
    ) -> aiohttp.web.StreamResponse:
        if (gv, plural) not in self._kinds:
            raise KubernetesError(404, "NotFound", f"the server could not find the resource {gv}/{plural}")
        body = await raw.read()
        if body and "protobuf" in raw.headers.get("Content-Type", ""):
            raise KubernetesError(415, "UnsupportedMediaType", "protobuf is not emulated: send JSON")
        data = yaml.safe_load(body) if body else None  # JSON, or YAML from a server-side apply
        method = raw.method
        if method == "GET" and raw.query.get("watch") in ("true", "1"):
            return await self._watch(raw, gv, plural, ns, name)
        if method == "GET" and not name:
            items = [copy.deepcopy(o) for k, o in self._select(gv, plural, ns, name)]
            kind = self._kinds[(gv, plural)] + "List"
            meta = {"resourceVersion": str(self._version)}
            return self._json({"apiVersion": gv, "kind": kind, "metadata": meta, "items": items})
        if method == "GET" and (gv, plural, sub) == ("v1", "pods", "log"):
            self._get((gv, plural, ns, name))  # 404 once the pod is gone, as the API server says
            log = self.pod_log_dir / f"{name}.log" if self.pod_log_dir is not None else None
            text = log.read_text(errors="replace") if log is not None and log.is_file() else ""
            return aiohttp.web.Response(text=text, content_type="text/plain")
        if method == "GET":
            return self._json(self._get((gv, plural, ns, name)))
        if method == "POST" and not name:
            return self._json(await self._create(gv, plural, ns, data), status=201)
        content_type = raw.headers.get("Content-Type", "")
        if method == "PATCH" and "apply-patch" in content_type and (gv, plural, ns, name) not in self._store:
            return self._json(await self._create(gv, plural, ns, data), status=201)  # apply creates
        if method == "PATCH" and name:
            return self._json(await self._patch((gv, plural, ns, name), sub, content_type, data))
        if method == "DELETE" and name:
            return self._json(await self._delete((gv, plural, ns, name)))
        raise KubernetesError(405, "MethodNotAllowed", f"{method} {raw.path} is not emulated")

    @staticmethod
    def _json(body: Any, status: int = 200) -> aiohttp.web.Response:
        return aiohttp.web.json_response(body, status=status)

    def _select(self, gv: str, plural: str, ns: str, name: str = "") -> list[tuple[Key, dict[str, Any]]]:
        return [
            (k, o)
            for k, o in self._store.items()
            if k[:2] == (gv, plural) and (not ns or k[2] == ns) and (not name or k[3] == name)
        ]

    def _get(self, key: Key) -> dict[str, Any]:
        if key not in self._store:
            raise KubernetesError(404, "NotFound", f'{key[1]} "{key[3]}" not found')
        return copy.deepcopy(self._store[key])

    async def _record(self, key: Key, type_: str, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        if type_ == "DELETED":
            self._store.pop(key, None)
        else:
            self._store[key] = obj
        self._log.append((self._version, key, type_, copy.deepcopy(obj)))
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _create(self, gv: str, plural: str, ns: str, data: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(data)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if ns:
            meta["namespace"] = ns
        key = (gv, plural, ns, meta["name"])
        if key in self._store:
            raise KubernetesError(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        obj.setdefault("apiVersion", gv)
        obj.setdefault("kind", self._kinds[(gv, plural)])
        if (gv, plural) == ("apiextensions.k8s.io/v1", "customresourcedefinitions"):
            self._register(obj)
        await self._record(key, "ADDED", obj)
        return copy.deepcopy(obj)

    def _register(self, crd: dict[str, Any]) -> None:
        """A CRD serves its resource at once (no real API server delay) and says it is Established."""
        spec = crd["spec"]
        for version in spec["versions"]:
            gv = f"{spec['group']}/{version['name']}"
            subresources = set(version.get("subresources", {}))
            self.resources[resource(spec["group"], version["name"], spec["names"]["plural"])] = ResourceInfo(
                kind=spec["names"]["kind"],
                singular=spec["names"].get("singular"),
                namespaced=spec["scope"] == "Namespaced",
                shortnames=set(spec["names"].get("shortNames", [])),
                verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
                subresources=subresources,
            )
            self._kinds[(gv, spec["names"]["plural"])] = spec["names"]["kind"]
            if "status" in subresources:
                self._with_status.add((gv, spec["names"]["plural"]))
        crd["status"] = {
            "conditions": [{"type": "Established", "status": "True"}],
            "acceptedNames": spec["names"],
        }

    async def _patch(self, key: Key, sub: str, content_type: str, data: Any) -> dict[str, Any]:
        old = self._get(key)
        if "json-patch" in content_type:
            try:
                new = jsonpatch.apply_patch(old, data)
            except jsonpatch.JsonPatchTestFailed as error:
                raise KubernetesError(422, "Invalid", f"the JSON patch test failed: {error}") from None
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
                raise KubernetesError(422, "Invalid", str(error)) from None
        else:  # merge patch (and strategic merge, which here merges the same way)
            new = merge_patch(old, data)
        new["metadata"]["uid"], new["metadata"]["name"] = old["metadata"]["uid"], old["metadata"]["name"]
        has_status = key[:2] in self._with_status
        if sub == "status":
            new = {**old, "status": new.get("status")}
        elif has_status:
            new["status"] = old.get("status")
        if new.get("status") is None:
            new.pop("status", None)
        if {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
            k: v for k, v in old.items() if k not in ("metadata", "status")
        }:
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if new == old:
            return old
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            await self._record(key, "DELETED", new)
        else:
            await self._record(key, "MODIFIED", new)
        return copy.deepcopy(new)

    async def _delete(self, key: Key) -> dict[str, Any]:
        obj = self._get(key)
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = _now()
                await self._record(key, "MODIFIED", obj)
            return obj
        await self._record(key, "DELETED", obj)
        return obj

    async def _watch(
        self, raw: aiohttp.web.BaseRequest, gv: str, plural: str, ns: str, name: str
    ) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        since = int(raw.query.get("resourceVersion") or 0)
        timeout_s = float(raw.query.get("timeoutSeconds") or 3600)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if since == 0:  # no version: the current objects as ADDED, then what changes
            for _, obj in self._select(gv, plural, ns, name):
                await response.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
            since = self._version
        assert self._changed is not None
        try:
            while loop.time() < deadline:
                for version, key, type_, obj in [e for e in self._log if e[0] > since]:
                    since = version
                    if key[:2] == (gv, plural) and (not ns or key[2] == ns) and (not name or key[3] == name):
                        await response.write(json.dumps({"type": type_, "object": obj}).encode() + b"\n")
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), max(0.01, deadline - loop.time()))
                    except TimeoutError:
                        break
        except (ConnectionResetError, asyncio.CancelledError):
            return response
        await response.write_eof()
        return response

    # --- for the test process (another thread) ----------------------------------------------------

    def snapshot(self, gv: str, plural: str, ns: str = "") -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for _, o in self._select(gv, plural, ns)]


class RunningEmulator:
    """The emulator on 127.0.0.1 in a thread of its own, with a kubeconfig file pointing at it."""

    def __init__(self, kubeconfig: Any) -> None:
        self.kubeconfig = kubeconfig
        self.emulator: Emulator | None = None
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="emulator", daemon=True)

    def __enter__(self) -> RunningEmulator:
        self._thread.start()
        if not self._started.wait(20) or self.emulator is None:
            raise RuntimeError("the emulator did not start")
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                    "users": [{"name": "test", "user": {"token": "test"}}],
                    "contexts": [
                        {
                            "name": "emulator",
                            "context": {"cluster": "emulator", "user": "test", "namespace": "default"},
                        }
                    ],
                    "current-context": "emulator",
                }
            )
        )
        return self

    def __exit__(self, *_: object) -> None:
        assert self._stop is not None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()
            self._started.set()  # a failed start must not leave __enter__ waiting

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with Emulator() as emulator, Server(emulator) as server:
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._started.set()
            await self._stop.wait()
