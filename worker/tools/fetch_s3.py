"""The S3 side of `fetch-model`, through boto3: the prefix listed (keys, sizes, ETags; their digest is
what the source resolves to), each object fetched with `If-Match` on its ETag (an object replaced
mid-fetch is refused, not spliced) and a `Range` from the bytes already staged, so a cut or a
restarted pod resumes. An object is verified against SHA256SUMS under the prefix when there is one,
else its ETag: the MD5 of a single-part upload, the MD5 of the part MD5s of a multipart one (the part
size read from the object's first part). Credentials: the AWS variables, or the pod's identity.

boto3 is the `fetch` extra (the worker and gateway images): botocore caps python-dateutil below 3,
which the operator's kubernetes client needs, so the two never share an environment.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from kembed.worker.tools.fetch_source import CHUNK_BYTES, Checksum, FetchError, Listing, RemoteFile

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
MD5 = re.compile(r"^[0-9a-f]{32}$")
MULTIPART = re.compile(r"^[0-9a-f]{32}-\d+$")


class S3Source:
    def __init__(self, bucket: str, prefix: str, endpoint_url: str = "", region: str = "") -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.description = f"s3://{bucket}/{self.prefix}"
        config = Config(
            retries={"max_attempts": 3, "mode": "standard"},
            # path-style for S3-compatible stores (MinIO, Ceph): their buckets are rarely DNS names
            s3={"addressing_style": "path" if endpoint_url else "auto"},
            connect_timeout=10,
            read_timeout=60,
        )
        self._client = boto3.client(
            "s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config
        )
        self._etags: dict[str, str] = {}

    def list(self) -> Listing:
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
        if not objects:
            raise FetchError("not_found", f"{self.description}: no objects under the prefix")
        digest = hashlib.sha256()
        for path, item in sorted(objects.items()):
            digest.update(f"{path}\t{item['Size']}\t{item['ETag']}\n".encode())
        sums = self._manifest() if MANIFEST_NAME in objects else {}
        files = []
        for path, item in sorted(objects.items()):
            etag = item["ETag"].strip('"')
            self._etags[path] = item["ETag"]
            files.append(RemoteFile(path, item["Size"], self._checksum(path, etag, sums)))
        return Listing(f"etags-sha256:{digest.hexdigest()[:32]}", tuple(files))

    def _manifest(self) -> dict[str, str]:
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self.prefix + MANIFEST_NAME)["Body"].read()
        except (ClientError, BotoCoreError) as error:
            raise self._error(error, MANIFEST_NAME) from None
        sums = {}
        for line in body.decode().splitlines():
            value, _, path = line.strip().partition(" ")
            if value:
                sums[path.strip().lstrip("*").removeprefix("./")] = value.lower()
        return sums

    def _checksum(self, path: str, etag: str, sums: dict[str, str]) -> Checksum | None:
        if path in sums:
            return Checksum("sha256", sums[path])
        if MD5.match(etag):
            return Checksum("md5", etag)
        if MULTIPART.match(etag) and self._is_wanted(path):
            try:  # every part but the last has the first's size
                head = self._client.head_object(Bucket=self.bucket, Key=self.prefix + path, PartNumber=1)
            except (ClientError, BotoCoreError) as error:
                raise self._error(error, path) from None
            part_bytes = int(head.get("ContentLength") or 0)
            return Checksum("s3-multipart", etag, part_bytes) if part_bytes > 0 else None
        return None

    @staticmethod
    def _is_wanted(path: str) -> bool:
        return path.endswith(".safetensors") or path.endswith(".json")  # worth a HEAD only if fetched

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
            extra = {"Range": f"bytes={have}-"} if have else {}
            try:
                answer = self._client.get_object(
                    Bucket=self.bucket, Key=key, IfMatch=self._etags[file.path], **extra
                )
                with part.open("ab") as out:
                    for chunk in answer["Body"].iter_chunks(CHUNK_BYTES):
                        out.write(chunk)
            except (ClientError, BotoCoreError) as error:
                raise self._error(error, file.path) from None
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

    def _error(self, error: Exception, path: str) -> FetchError:
        where = f"{self.description}{path}"
        if isinstance(error, NoCredentialsError):
            return FetchError(
                "forbidden", f"{where}: no credentials (s3.credentialsSecretRef, or a pod identity)", path
            )
        if isinstance(error, ClientError):
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            text = error.response.get("Error", {}).get("Message", "") or code
            if code in FORBIDDEN:
                return FetchError("forbidden", f"{where}: HTTP {status} {code}: {text}", path)
            if code in NOT_FOUND:
                return FetchError("not_found", f"{where}: HTTP {status} {code}: {text}", path)
            if code in ("PreconditionFailed", "412"):
                return FetchError("changed", f"{where}: the object changed during the fetch (its ETag)", path)
            is_transient = status is None or status >= 500 or code in ("SlowDown", "RequestTimeout", "503")
            return FetchError(
                "network" if is_transient else "other",
                f"{where}: HTTP {status} {code}: {text}",
                path,
                is_transient=is_transient,
            )
        # connection refused, a read cut mid-body, a timeout: botocore's own retries are spent
        return FetchError("network", f"{where}: {type(error).__name__}: {error}", path, is_transient=True)
