"""Golden embeddings by default: what the first gated revision of given weights answered for fixed
texts, kept in a ConfigMap per weights; every later revision of the same weights must answer the same.

The golden Job (jobs.py, the gateway image's `python -m kembed.gateway.golden`) tokenizes fixed texts
with the gateway's own tokenizer, embeds them on every candidate pod, and prints one record line: the
weights' digest (the weight files' content, not the tokenizer, config or pooling) and the first pod's
rows. Here, pure functions: read that record from the Job's log, judge it against the record kept for
the same weights, and render the ConfigMap that keeps a new one. `rollout.golden` says what is done:
Check (a record is made for weights seen for the first time once the whole gate passes, and checked
for every later revision), Record (this revision's answer replaces the record of its weights: an
intended change of the output, e.g. another pooling or prompt) or Off.

The operator reads the record from the Job's log (`pods/log`): the pod's termination message (4 KiB)
cannot hold a few thousand floats, and the Job's pods run as the workers' service account, which is
granted nothing, so they cannot write the ConfigMap themselves.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from array import array
from dataclasses import dataclass
from typing import Any

from kembed.operator.build import naming as n
from kembed.operator.build.naming import Owner

RECORD_PREFIX = "kembed-golden-record: "  # as kembed.gateway.golden prints it
RECORD_KEY = "record.json"
WEIGHTS_LABEL = "kembed.dev/weights"  # the digest's first 32 hex digits (a label value is <= 63)
RECORDED_FROM = "kembed.dev/recorded-from"
RECORDED_AT = "kembed.dev/recorded-at"
MAX_RECORDS = 5  # weights a model keeps records of; the oldest go first
MAX_SCORE_ERROR = 0.02  # a cross-encoder's logits: |a - b| / (1 + |b|), bf16 kernels differ by ~0.005
# An embedding's norm against its record's, |a - b| / b: bf16 kernels move it by well under 1 %; a
# normalisation turned off or on moves it by a factor (MiniLM's mean-pooled rows: ~0.2-0.5 of one).
MAX_NORM_ERROR = 0.02


@dataclass(frozen=True)
class GoldenRecord:
    """One revision's answer for the golden texts."""

    weights: str  # sha256:<64 hex>
    task: str  # "embed" (rows are embeddings) or "score" (rows are logits)
    texts_sha256: str
    rows: tuple[tuple[float, ...], ...]
    raw: str  # the JSON as printed, stored as it is
    version: int = 1
    # the fixed prompted texts' rows under each of the model's prompts, by prompt name (version 2)
    prompted: tuple[tuple[str, tuple[tuple[float, ...], ...]], ...] = ()

    @property
    def has_norms(self) -> bool:
        """Whether the rows are as clients got them (version 2), not raw pooled rows."""
        return self.version >= 2

    @property
    def weights_id(self) -> str:
        return self.weights.removeprefix("sha256:")[:32]


class UnreadableRecord(ValueError):
    """The Job's log holds no record line, or a malformed one."""


def _floats(encoded: str) -> tuple[float, ...]:
    values = array("f", base64.b64decode(encoded, validate=True))
    if sys.byteorder == "big":  # printed little-endian
        values.byteswap()
    return tuple(values)


def parse(text: str) -> GoldenRecord:
    """The record from a record line's JSON (the Job's log, or a ConfigMap's RECORD_KEY)."""
    try:
        data = json.loads(text)
        rows = tuple(_floats(row) for row in data["rows"])
        prompted = tuple(
            (str(name), tuple(_floats(row) for row in block))
            for name, block in sorted((data.get("prompted") or {}).items())
        )
        version = int(data.get("version", 1))
        record = GoldenRecord(
            data["weights"], data["task"], data["textsSha256"], rows, text, version, prompted
        )
    except (ValueError, KeyError, TypeError) as error:
        raise UnreadableRecord(f"malformed golden record: {error}") from None
    if not record.weights.startswith("sha256:") or not rows or len({len(r) for r in rows}) != 1:
        raise UnreadableRecord("malformed golden record: no weights digest, or rows of unequal length")
    return record


def from_log(log: str) -> GoldenRecord:
    lines = [line for line in log.splitlines() if line.startswith(RECORD_PREFIX)]
    if not lines:
        raise UnreadableRecord("the golden Job's log holds no record line")
    return parse(lines[-1].removeprefix(RECORD_PREFIX))


def agreement(record: GoldenRecord, kept: GoldenRecord) -> tuple[float, int]:
    """(the least agreement over rows, the row where it is least): cosine for embeddings; for logits
    1 - |a - b| / (1 + |b|), so that the same min bar reads the same way."""
    return _agreement(record.task, record.rows, kept.rows)


def _agreement(
    task: str, rows: tuple[tuple[float, ...], ...], kept_rows: tuple[tuple[float, ...], ...]
) -> tuple[float, int]:
    worst, where = math.inf, -1
    for i, (got, want) in enumerate(zip(rows, kept_rows, strict=True)):
        if task == "score":
            value = 1.0 - max(abs(a - b) / (1.0 + abs(b)) for a, b in zip(got, want, strict=True))
        else:
            dot = sum(a * b for a, b in zip(got, want, strict=True))
            norms = math.sqrt(sum(a * a for a in got)) * math.sqrt(sum(b * b for b in want))
            value = dot / norms if norms > 0 else -1.0
        if value < worst:
            worst, where = value, i
    return worst, where


@dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str
    record: GoldenRecord | None = None  # to keep once the gate passes (new weights, or Record)


def judge(record: GoldenRecord, kept: GoldenRecord | None, policy: str, min_cosine: float) -> Verdict:
    """Whether `record` passes against `kept`, the record of the same weights (None: none kept)."""
    short = record.weights.removeprefix("sha256:")[:12]
    if policy == "Record":
        return Verdict(True, f"weights {short}: this revision's answer replaces their golden record", record)
    if kept is None:
        return Verdict(True, f"weights {short} seen for the first time: their golden record is kept", record)
    if kept.texts_sha256 != record.texts_sha256 or kept.task != record.task:
        return Verdict(
            True, f"weights {short}: the kept record is of other golden texts; it is replaced", record
        )
    if len(kept.rows) != len(record.rows) or len(kept.rows[0]) != len(record.rows[0]):
        shape = f"{len(record.rows)}x{len(record.rows[0])}, recorded {len(kept.rows)}x{len(kept.rows[0])}"
        return Verdict(False, f"weights {short}: the answer's shape changed ({shape})")
    bar = 1.0 - MAX_SCORE_ERROR if record.task == "score" else min_cosine
    kept_prompted = dict(kept.prompted)
    # the default rows, then each prompt the kept record has too (a prompt added has no record yet)
    blocks = [("", record.rows, kept.rows)]
    blocks += [(name, rows, kept_prompted[name]) for name, rows in record.prompted if name in kept_prompted]
    least = math.inf
    for name, rows, kept_rows in blocks:
        under = f" under prompt {name!r}" if name else ""
        if len(rows) != len(kept_rows) or len(rows[0]) != len(kept_rows[0]):
            return Verdict(False, f"weights {short}: the answer's shape{under} changed")
        worst, row = _agreement(record.task, rows, kept_rows)
        least = min(least, worst)
        if worst < bar:
            return Verdict(
                False,
                f"weights {short}: golden text {row}{under} answers {worst:.6f} against the record (need "
                f">= {bar}); the same weights answered otherwise before: a wrong tokenizer, pooling, "
                "prompt, length limit or engine. If the change is intended, set rollout.golden: Record "
                "for this rollout",
            )
        if record.task == "embed" and record.has_norms and kept.has_norms:
            error, row, norm, kept_norm = _norm_error(rows, kept_rows)
            if error > MAX_NORM_ERROR:
                return Verdict(
                    False,
                    f"weights {short}: golden text {row}{under} has norm {norm:.4f} against the "
                    f"record's {kept_norm:.4f} (need within {MAX_NORM_ERROR:.0%}): the same weights "
                    "answered otherwise before: normalisation on or off, or a pooling that scales. If "
                    "the change is intended, set rollout.golden: Record for this rollout",
                )
    matched = f"weights {short}: golden texts match their record (least {least:.6f})"
    if not kept.has_norms and record.has_norms:  # an older record: renewed, with norms and prompts
        return Verdict(True, f"{matched}; it is renewed", record)
    return Verdict(True, matched)


def _norm_error(
    rows: tuple[tuple[float, ...], ...], kept_rows: tuple[tuple[float, ...], ...]
) -> tuple[float, int, float, float]:
    """(the largest |norm - kept norm| / kept norm, its row, the two norms)."""
    worst: tuple[float, int, float, float] = (0.0, -1, 0.0, 0.0)
    for i, (got, want) in enumerate(zip(rows, kept_rows, strict=True)):
        norm, kept_norm = math.sqrt(sum(a * a for a in got)), math.sqrt(sum(b * b for b in want))
        error = abs(norm - kept_norm) / max(kept_norm, 1e-12)
        if error > worst[0]:
            worst = (error, i, norm, kept_norm)
    return worst


def config_map_name(owner: Owner, record: GoldenRecord) -> str:
    return f"{owner.name}-golden-{record.weights_id[:12]}"


def config_map(owner: Owner, record: GoldenRecord, revision: str, now: str) -> dict[str, Any]:
    labels = n.labels(owner, "golden") | {WEIGHTS_LABEL: record.weights_id}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(owner, record),
            "namespace": owner.namespace,
            "labels": labels,
            "annotations": {RECORDED_FROM: revision, RECORDED_AT: now},
            "ownerReferences": [owner.reference()],
        },
        "data": {RECORD_KEY: record.raw},
    }


def kept(config_maps: list[dict[str, Any]]) -> dict[str, GoldenRecord]:
    """The readable records among the model's golden ConfigMaps, by weights id."""
    found: dict[str, GoldenRecord] = {}
    for body in config_maps:
        try:
            record = parse((body.get("data") or {}).get(RECORD_KEY, ""))
        except UnreadableRecord:
            continue  # a record edited by hand into nonsense counts as none: the next gate records anew
        found[record.weights_id] = record
    return found


def surplus(config_maps: list[dict[str, Any]], keep: str) -> list[str]:
    """Names of the oldest golden ConfigMaps past MAX_RECORDS; `keep` (just written) is never one."""

    def recorded_at(body: dict[str, Any]) -> str:
        return str((body["metadata"].get("annotations") or {}).get(RECORDED_AT, ""))

    others = sorted((b for b in config_maps if b["metadata"]["name"] != keep), key=recorded_at, reverse=True)
    return [b["metadata"]["name"] for b in others[MAX_RECORDS - 1 :]]
