"""The Hugging Face Hub side of `fetch-model`, through `huggingface_hub`: the revision resolved to its
commit and the files listed with their LFS sha256 or git blob sha1 (`model_info(files_metadata=True)`),
each file fetched at that commit by `hf_hub_download` into the staging directory (which resumes a
partial download it finds there). The token is HF_TOKEN, read by the client itself.

What was resolved is fetched by its commit sha, never by the branch again: a commit outlives the
branch that pointed at it, so a pod restarted after a push to `main` fetches what its revision was
made from. Every call waits at most `timeout_s` for an answer (the client's own default is to wait
forever for model-info); a download's body reads are bounded by the client's HF_HUB_DOWNLOAD_TIMEOUT
(10 s unless set) and resumed.
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

from kembed.worker.tools.fetch_source import (
    DEFAULT_TIMEOUT_S,
    Checksum,
    FetchError,
    Listing,
    RemoteFile,
    Wanted,
)


class HubSource:
    def __init__(
        self, repo: str, revision: str, endpoint: str = "", timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.repo, self.revision, self.endpoint = repo, revision, endpoint or None
        self.description = f"hf://{repo}@{revision}"
        self.timeout_s = timeout_s
        self._commit = revision

    def list(self, wanted: Wanted) -> Listing:
        """The revision resolved now (the commit is the whole answer: `wanted` changes nothing)."""
        return self._list_at(self.revision)

    def pinned(self, resolved: str, pin: str, wanted: Wanted) -> Listing:
        return self._list_at(resolved)

    def _list_at(self, revision: str) -> Listing:
        api = HfApi(endpoint=self.endpoint)
        try:
            info = api.model_info(self.repo, revision=revision, files_metadata=True, timeout=self.timeout_s)
        except Exception as error:
            raise self._error(error, "", revision) from None
        if not info.sha:
            raise FetchError("not_found", f"{self.description}: the Hub named no commit")
        self._commit = info.sha
        try:  # a gated or private repo lists its files to anyone: whether it can be read is told here
            get_hf_file_metadata(
                hf_hub_url(self.repo, "config.json", revision=info.sha, endpoint=self.endpoint),
                timeout=self.timeout_s,
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
                self.repo,
                file.path,
                revision=self._commit,
                local_dir=staging,
                endpoint=self.endpoint,
                etag_timeout=self.timeout_s,
            )
        except Exception as error:
            raise self._error(error, file.path) from None
        return Path(path)

    def _error(self, error: Exception, path: str, revision: str = "") -> FetchError:
        where = f"{self.description}{'/' + path if path else ''}"
        revision = revision or self.revision
        if isinstance(error, GatedRepoError):
            return FetchError(
                "forbidden",
                f"{where}: a gated repository: accept its terms on the Hub with an account, and give that "
                "account's token (huggingFace.tokenSecretRef)",
                path,
            )
        if isinstance(error, RevisionNotFoundError):
            return FetchError("not_found", f"{where}: no revision {revision!r}", path)
        if isinstance(error, EntryNotFoundError):
            return FetchError("not_found", f"{where}: no such file at {self._commit}", path)
        if isinstance(error, RepositoryNotFoundError) and _status(error) == 401:
            # The Hub answers 401 to a request without a token (or with one that cannot read the
            # repository) for a private repository and a missing one alike: a token is what to fix.
            return FetchError(
                "forbidden",
                f"{where}: HTTP 401: a private repository this token cannot read, or none without a "
                "token: give a token that can read it (huggingFace.tokenSecretRef), and check the name",
                path,
            )
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
