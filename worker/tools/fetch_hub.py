"""The Hugging Face Hub side of `fetch-model`, through `huggingface_hub`: the revision resolved to its
commit and the files listed with their LFS sha256 or git blob sha1 (`model_info(files_metadata=True)`),
each file fetched at that commit by `hf_hub_download` into the staging directory (which resumes a
partial download it finds there). The token is HF_TOKEN, read by the client itself.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from kembed.worker.tools.fetch_source import Checksum, FetchError, Listing, RemoteFile


class HubSource:
    def __init__(self, repo: str, revision: str, endpoint: str = "") -> None:
        self.repo, self.revision, self.endpoint = repo, revision, endpoint or None
        self.description = f"hf://{repo}@{revision}"
        self._commit = revision

    def list(self) -> Listing:
        api = HfApi(endpoint=self.endpoint)
        try:
            info = api.model_info(self.repo, revision=self.revision, files_metadata=True)
        except Exception as error:
            raise self._error(error, "") from None
        if not info.sha:
            raise FetchError("not_found", f"{self.description}: the Hub named no commit")
        self._commit = info.sha
        try:  # a gated or private repo lists its files to anyone: whether it can be read is told here
            get_hf_file_metadata(
                hf_hub_url(self.repo, "config.json", revision=info.sha, endpoint=self.endpoint)
            )
        except Exception as error:
            raise self._error(error, "config.json") from None
        files = []
        for sibling in info.siblings or []:
            checksum: Checksum | None
            if sibling.lfs is not None:
                checksum = Checksum("sha256", sibling.lfs.sha256)
                size = sibling.lfs.size
            else:
                checksum = Checksum("git-sha1", sibling.blob_id) if sibling.blob_id else None
                size = sibling.size or 0
            files.append(RemoteFile(sibling.rfilename, size, checksum))
        return Listing(info.sha, tuple(files))

    def download(self, file: RemoteFile, staging: Path) -> Path:
        try:
            path = hf_hub_download(
                self.repo, file.path, revision=self._commit, local_dir=staging, endpoint=self.endpoint
            )
        except Exception as error:
            raise self._error(error, file.path) from None
        return Path(path)

    def _error(self, error: Exception, path: str) -> FetchError:
        where = f"{self.description}{'/' + path if path else ''}"
        if isinstance(error, GatedRepoError):
            return FetchError(
                "forbidden",
                f"{where}: a gated repository: accept its terms on the Hub with an account, and give that "
                "account's token (huggingFace.tokenSecretRef)",
                path,
            )
        if isinstance(error, RevisionNotFoundError):
            return FetchError("not_found", f"{where}: no revision {self.revision!r}", path)
        if isinstance(error, EntryNotFoundError):
            return FetchError("not_found", f"{where}: no such file at {self._commit}", path)
        if isinstance(error, RepositoryNotFoundError):
            return FetchError(
                "not_found",
                f"{where}: no such repository, or a private one this token cannot read "
                f"(HTTP {_status(error)})",
                path,
            )
        if isinstance(error, HfHubHTTPError):
            status = _status(error)
            if status in (401, 403):
                return FetchError("forbidden", f"{where}: HTTP {status}: {_first_line(error)}", path)
            if status == 404:
                return FetchError("not_found", f"{where}: HTTP 404", path)
            return FetchError(
                "network",
                f"{where}: HTTP {status}: {_first_line(error)}",
                path,
                is_transient=status is None or status >= 500 or status == 429,
            )
        # The client's transport errors (its httpx: a refused connection, a cut, a timeout) are worth a
        # retry; a local file system error (ENOSPC) goes to the caller, which says what it is.
        if _is_transport(error) or isinstance(error, ConnectionError | TimeoutError):
            return FetchError("network", f"{where}: {type(error).__name__}: {error}", path, is_transient=True)
        if isinstance(error, OSError):
            raise error
        return FetchError("other", f"{where}: {type(error).__name__}: {error}", path)


def _is_transport(error: Exception) -> bool:
    return type(error).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2")


def _status(error: Exception) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
