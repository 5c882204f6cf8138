"""The S3 side of `fetch-model`, through boto3: the prefix listed (keys, sizes, ETags), each object
fetched with `If-Match` on its ETag (an object replaced mid-fetch is refused, not spliced) and a
`Range` from the bytes already staged, so a cut or a restarted pod resumes. An object is verified
against SHA256SUMS under the prefix when there is one, else its ETag: the MD5 of a single-part
upload, the MD5 of the part MD5s of a multipart one (the part size read from the object's first
part). Credentials: the AWS variables, or the pod's identity.

- **Resolved from what is fetched**: the digest covers the objects fetch-model fetches (the
  `wanted` selection: the same patterns, no pickles), so a README or anything else under the prefix
  that no pod reads changes nothing. For a prefix holding only fetched objects and no SHA256SUMS
  it is the digest of every object, as it was before only those counted.
- **Pinned**: resolving HEADs each fetched object; the pin is their VersionIds when the bucket keeps
  versions (every one has a real one, not "null"), else their ETags. A fetch given the pin asks for
  exactly those: by VersionId (a later upload changes nothing), or, unversioned, refuses an object
  replaced or deleted since, naming it (what was resolved no longer exists: fetching the new bytes
  would serve a model no gate has seen). SHA256SUMS, when there is one, is pinned by its version;
  without versions it is read as it is, and its sums of the fetched objects must be those resolved.

boto3 is the `fetch` extra (the worker and gateway images): botocore caps python-dateutil below 3,
which the operator's kubernetes client needs, so the two never share an environment.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from kembed.worker.tools.fetch_source import (
    CHUNK_BYTES,
    DEFAULT_TIMEOUT_S,
    Checksum,
    FetchError,
    Listing,
    RemoteFile,
    Wanted,
)

MANIFEST_NAME = "SHA256SUMS"  # `sha256sum` output: "<hex>  <path>" per line, paths under the prefix
FORBIDDEN = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "403",
    "401",
    "AllAccessDisabled",
    "AccountProblem",
}
NOT_FOUND = {"NoSuchBucket", "NoSuchKey", "404"}
GONE_VERSION = {"NoSuchVersion", "NoSuchKey", "404", "InvalidArgument", "400"}
MD5 = re.compile(r"^[0-9a-f]{32}$")
MULTIPART = re.compile(r"^[0-9a-f]{32}-\d+$")
BY_VERSION, BY_ETAG = "version", "etag"  # the pin's kinds
MAX_ATTEMPTS = 3  # botocore's own retries of a call (throttling, 5xx, a timeout)


def etag_of(raw: str) -> str:
    return raw.strip('"')


def digest(entries: list[tuple[str, int, str, str]]) -> str:
    """The resolution: (path, size, ETag, sha256 from SHA256SUMS or "") of each fetched object."""
    h = hashlib.sha256()
    for path, size, etag, sha256 in sorted(entries):
        h.update(f'{path}\t{size}\t"{etag}"{chr(9) + sha256 if sha256 else ""}\n'.encode())
    return f"etags-sha256:{h.hexdigest()[:32]}"


def parse_pin(pin: str) -> tuple[str, dict[str, str]]:
    try:
        body = json.loads(pin)
        by, objects = body["by"], body["objects"]
        if by in (BY_VERSION, BY_ETAG) and isinstance(objects, dict) and objects:
            return by, {str(k): str(v) for k, v in objects.items()}
    except (ValueError, KeyError, TypeError):
        pass
    raise FetchError("refused", f"--pin {pin[:80]!r} is not a pin this command wrote")


class S3Source:
    def __init__(
        self, bucket: str, prefix: str, endpoint_url: str = "", region: str = "", timeout_s: float = 0
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.description = f"s3://{bucket}/{self.prefix}"
        timeout_s = timeout_s or DEFAULT_TIMEOUT_S
        config = Config(
            retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
            # path-style for S3-compatible stores (MinIO, Ceph): their buckets are rarely DNS names
            s3={"addressing_style": "path" if endpoint_url else "auto"},
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
        )
        self._client = boto3.client(
            "s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config
        )
        self._asks: dict[str, dict[str, str]] = {}  # path -> what its GET asks for (IfMatch, VersionId)
        self._sums: dict[str, str] = {}  # path -> sha256, from the (pinned) SHA256SUMS

    # --- resolving now ----------------------------------------------------------------------------

    def list(self, wanted: Wanted) -> Listing:
        objects = self._objects()
        if not objects:
            raise FetchError("not_found", f"{self.description}: no objects under the prefix")
        # Each fetched object's HEAD is what is resolved (its size, ETag and VersionId agree even if
        # it was replaced since the listing); the rest are listed for check_servable's hints only.
        chosen = sorted(p for p in objects if wanted(p) and p != MANIFEST_NAME)
        heads = {p: self._head(p, {}, is_fetched=True) for p in chosen}
        if MANIFEST_NAME in objects:
            heads[MANIFEST_NAME] = self._head(MANIFEST_NAME, {}, is_fetched=False)
        versions = {p: str(h.get("VersionId") or "") for p, h in heads.items()}
        # "null" is the version of an object written while versioning was off or suspended: the next
        # such upload replaces it, so it pins nothing
        by = BY_VERSION if heads and all(v and v != "null" for v in versions.values()) else BY_ETAG
        # Pinned by ETag, SHA256SUMS is not: regenerated for a README beside the model it changes
        # nothing fetched, and a changed sum of a fetched file changes the digest (which holds them)
        ids = {
            p: versions[p] if by == BY_VERSION else etag_of(h["ETag"])
            for p, h in heads.items()
            if by == BY_VERSION or p != MANIFEST_NAME
        }
        pin = json.dumps({"by": by, "objects": ids}, separators=(",", ":"), sort_keys=True)
        files = self._files(by, ids, heads)
        others = [RemoteFile(p, o["Size"], None) for p, o in objects.items() if p not in heads]
        return Listing(self._digest(files), tuple(sorted([*files, *others], key=lambda f: f.path)), pin)

    def _objects(self) -> dict[str, dict[str, Any]]:
        objects: dict[str, dict[str, Any]] = {}
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            ):
                for item in page.get("Contents", []):
                    if not item["Key"].endswith("/"):  # a "folder" marker
                        objects[item["Key"].removeprefix(self.prefix)] = item
        except (ClientError, BotoCoreError) as error:
            raise self._error(error, "") from None
        return objects

    def _head(self, path: str, ask: dict[str, str], is_fetched: bool) -> dict[str, Any]:
        """HEAD of `path` as `ask` names it (a VersionId, an ETag to match); of its first part too
        when it is fetched and a multipart upload: every part but the last has the first's size,
        which its checksum needs."""
        key = self.prefix + path
        try:
            head: dict[str, Any] = self._client.head_object(Bucket=self.bucket, Key=key, **ask)
            if is_fetched and MULTIPART.match(etag_of(head.get("ETag", ""))):
                first = self._client.head_object(Bucket=self.bucket, Key=key, PartNumber=1, **ask)
                head = head | {"PartBytes": int(first.get("ContentLength") or 0)}
        except (ClientError, BotoCoreError) as error:
            raise self._error(error, path, ask) from None
        return head

    def _files(
        self, by: str, ids: dict[str, str], heads: dict[str, dict[str, Any]]
    ) -> tuple[RemoteFile, ...]:
        """The fetched objects as their HEADs describe them, each GET from now on asking for exactly
        that object: its VersionId (pinned by version) and its ETag."""
        for path, head in heads.items():
            self._asks[path] = {"IfMatch": head["ETag"]} | (
                {"VersionId": ids[path]} if by == BY_VERSION and path in ids else {}
            )
        self._sums = self._manifest() if MANIFEST_NAME in heads else {}
        return tuple(
            RemoteFile(p, int(h["ContentLength"]), self._checksum(p, etag_of(h["ETag"]), self._sums, h))
            for p, h in sorted(heads.items())
            if p != MANIFEST_NAME
        )

    def _digest(self, files: Sequence[RemoteFile]) -> str:
        entries = [
            (f.path, f.size, etag_of(self._asks[f.path]["IfMatch"]), self._sums.get(f.path, ""))
            for f in files
        ]
        return digest(entries)

    def _manifest(self) -> dict[str, str]:
        try:
            answer = self._client.get_object(
                Bucket=self.bucket, Key=self.prefix + MANIFEST_NAME, **self._asks[MANIFEST_NAME]
            )
            body = answer["Body"].read()
        except (ClientError, BotoCoreError) as error:
            raise self._error(error, MANIFEST_NAME, self._asks[MANIFEST_NAME]) from None
        sums = {}
        for line in body.decode().splitlines():
            value, _, path = line.strip().partition(" ")
            if value:
                sums[path.strip().lstrip("*").removeprefix("./")] = value.lower()
        return sums

    @staticmethod
    def _checksum(path: str, etag: str, sums: dict[str, str], head: dict[str, Any] | None) -> Checksum | None:
        if path in sums:
            return Checksum("sha256", sums[path])
        if MD5.match(etag):
            return Checksum("md5", etag)
        part_bytes = int((head or {}).get("PartBytes") or 0)
        if MULTIPART.match(etag) and part_bytes > 0:
            return Checksum("s3-multipart", etag, part_bytes)
        return None  # not fetched (no HEAD), or an ETag that is no MD5 (SSE-KMS): refused if fetched

    # --- what was resolved ------------------------------------------------------------------------

    def pinned(self, resolved: str, pin: str, wanted: Wanted) -> Listing:
        """The pinned objects: by VersionId, or (unversioned) only while each still has its ETag.
        Without a pin (an older resolution, or one of too many objects to carry one) the prefix
        must still resolve to `resolved` (the caller compares)."""
        if not pin:
            return self.list(wanted)
        by, ids = parse_pin(pin)
        if by == BY_VERSION:
            heads = {
                p: self._head(p, {"VersionId": v}, is_fetched=p != MANIFEST_NAME) for p, v in ids.items()
            }
        else:
            heads = self._unchanged(ids)
        files = self._files(by, ids, heads)
        return Listing(self._digest(files), files, pin)

    def _unchanged(self, etags: dict[str, str]) -> dict[str, dict[str, Any]]:
        """The HEADs of the objects pinned by ETag, refusing (naming them) any replaced or deleted."""
        objects = self._objects()
        changed = [p for p, etag in etags.items() if p not in objects or etag_of(objects[p]["ETag"]) != etag]
        if changed:
            what = ", ".join(
                f"{p} ({'deleted' if p not in objects else 'replaced: ETag ' + etag_of(objects[p]['ETag'])})"
                for p in changed[:3]
            )
            raise FetchError(
                "changed",
                f"{self.description}: {what}{' and more' if len(changed) > 3 else ''} since it was "
                "resolved for this revision, and the bucket keeps no versions to fetch what was resolved "
                "from: restore it, or change the source (or its refreshSeconds) for a new revision",
                changed[0],
            )
        heads = {p: self._head(p, {"IfMatch": f'"{e}"'}, is_fetched=True) for p, e in etags.items()}
        if MANIFEST_NAME in objects:  # as it is now: the caller's digest check covers its sums
            heads[MANIFEST_NAME] = self._head(MANIFEST_NAME, {}, is_fetched=False)
        return heads

    # --- fetching ---------------------------------------------------------------------------------

    def download(self, file: RemoteFile, staging: Path) -> Path:
        final = staging / file.path
        if final.is_file() and final.stat().st_size == file.size:
            return final  # staged whole by an earlier run: verified by the caller
        part = staging / ".parts" / (file.path + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        if have > file.size:
            part.unlink()
            have = 0
        key = self.prefix + file.path
        if have < file.size:
            ask = self._asks[file.path] | ({"Range": f"bytes={have}-"} if have else {})
            try:
                answer = self._client.get_object(Bucket=self.bucket, Key=key, **ask)
                with part.open("ab") as out:
                    for chunk in answer["Body"].iter_chunks(CHUNK_BYTES):
                        out.write(chunk)
            except (ClientError, BotoCoreError) as error:
                raise self._error(error, file.path, ask) from None
            except (ConnectionError, TimeoutError) as error:
                raise FetchError(
                    "network", f"{self.description}{file.path}: {error}", file.path, is_transient=True
                ) from None
            if part.stat().st_size < file.size:
                raise FetchError(
                    "network",
                    f"{self.description}{file.path}: cut at {part.stat().st_size} of {file.size} bytes",
                    file.path,
                    is_transient=True,
                )
        final.parent.mkdir(parents=True, exist_ok=True)
        part.rename(final)
        return final

    def _error(self, error: Exception, path: str, ask: dict[str, str] | None = None) -> FetchError:
        where = f"{self.description}{path}"
        if isinstance(error, NoCredentialsError):
            return FetchError(
                "forbidden", f"{where}: no credentials (s3.credentialsSecretRef, or a pod identity)", path
            )
        if isinstance(error, ClientError):
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            text = error.response.get("Error", {}).get("Message", "") or code
            version = (ask or {}).get("VersionId")
            if code in FORBIDDEN:
                extra = " (a pinned version needs s3:GetObjectVersion)" if version else ""
                return FetchError("forbidden", f"{where}: HTTP {status} {code}: {text}{extra}", path)
            if version and code in GONE_VERSION:
                return FetchError(
                    "changed",
                    f"{where}: version {version}, resolved for this revision, is gone (deleted, or "
                    f"expired by a lifecycle rule): HTTP {status} {code}",
                    path,
                )
            if code in NOT_FOUND:
                return FetchError("not_found", f"{where}: HTTP {status} {code}: {text}", path)
            if code in ("PreconditionFailed", "412"):
                return FetchError(
                    "changed",
                    f"{where}: replaced since it was resolved (its ETag is no longer "
                    f"{(ask or {}).get('IfMatch', '?')}); the fetch refuses other bytes than those resolved",
                    path,
                )
            is_transient = status is None or status >= 500 or code in ("SlowDown", "RequestTimeout", "503")
            return FetchError(
                "network" if is_transient else "other",
                f"{where}: HTTP {status} {code}: {text}",
                path,
                is_transient=is_transient,
            )
        # connection refused, a read cut mid-body, a timeout: botocore's own retries are spent
        return FetchError("network", f"{where}: {type(error).__name__}: {error}", path, is_transient=True)
