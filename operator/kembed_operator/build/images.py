"""Image references and digests: `rollout.requireDigests` refuses a reference without one, and a
revision whose tag moved under it is pinned to the digest its gated pods ran (rollout.py).

A pod's `status.containerStatuses[].imageID` says what the runtime pulled, as `<repo>@sha256:<hex>`
(containerd, CRI-O) or with a `docker-pullable://` prefix (dockershim): the digest is what counts.
"""

from __future__ import annotations

import re
from typing import Any

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def is_by_digest(reference: str) -> bool:
    """Whether `reference` names its image by digest (`repo@sha256:...`, a tag before it or not)."""
    _, at, digest = reference.partition("@")
    return bool(at) and DIGEST.fullmatch(digest) is not None


def by_digest(reference: str, digest: str) -> str:
    """`reference` with its tag (or digest) replaced by `digest`: registry:5000/team/worker:1 ->
    registry:5000/team/worker@sha256:..."""
    name = reference.partition("@")[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:  # a tag; a colon before the last slash is a registry's port
        name = name[: len(name) - len(last) + last.index(":")]
    return f"{name}@{digest}"


def pod_digest(pod: dict[str, Any], container: str) -> str:
    """The digest `container` of `pod` runs, "" where the runtime reports none."""
    for status in pod.get("status", {}).get("containerStatuses", []):
        if status.get("name") == container:
            found = DIGEST.search(status.get("imageID", ""))
            return found.group(0) if found else ""
    return ""


def undigested(references: dict[str, str]) -> list[str]:
    """`what: reference` for each of `references` (what -> reference) not named by digest."""
    return [f"{what} {ref!r}" for what, ref in references.items() if not is_by_digest(ref)]
