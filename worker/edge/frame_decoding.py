"""A RequestFrame read as arrays (frames.py admits them): its per-request and per-sequence fields
as numpy views, their sizes checked against each other; each request's class; the outputs and span
bounds it asks for; whether its kind is the model's. All of it over the whole frame, no Python per
request; a field that disagrees fails the whole frame (InvalidInput)."""

from __future__ import annotations

import numpy as np

from kembed.proto import embedder_pb2 as pb
from kembed.proto.outputs import DENSE, OutputShape, names_of
from kembed.worker.classes import INTERACTIVE_MAX_SEQUENCES, INTERACTIVE_MAX_TOKENS, Priority
from kembed.worker.edge.validation import sequences_problem, spans_of, token_types_problem
from kembed.worker.edge.vocabulary import check_asks
from kembed.worker.errors import InvalidInput, Unsupported
from kembed.worker.info import ModelInfo

_KINDS: dict[int, str] = {pb.FRAME_KIND_EMBED: "embed", pb.FRAME_KIND_SCORE: "score"}

FrameArrays = tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None
]
"""(num_sequences, lengths, token_ids, token types, priorities, timeouts) of a frame."""


def frame_arrays(message: pb.RequestFrame, num_requests: int) -> FrameArrays:
    """(num_sequences, lengths, token_ids, token types, priorities, timeouts) of a frame, their sizes
    checked against each other; InvalidInput (for every request of the frame) where they disagree."""

    def array(field: str, dtype: str, expected: int | None) -> np.ndarray | None:
        data: bytes = getattr(message, field)
        if not data and field in _OPTIONAL:
            return None
        width = np.dtype(dtype).itemsize
        if len(data) % width or (expected is not None and len(data) // width != expected):
            wanted = f"{expected} values" if expected is not None else f"a multiple of {width} bytes"
            raise InvalidInput(
                f"a frame's {field} holds {len(data)} bytes; {wanted} of {width} bytes were expected"
            )
        return np.frombuffer(data, dtype)

    num_sequences = array("num_sequences", "<u4", num_requests)
    assert num_sequences is not None
    lengths = array("lengths", "<u4", int(num_sequences.sum()))
    assert lengths is not None
    num_tokens = int(lengths.sum())
    token_ids = array("token_ids", "<i4", num_tokens)
    assert token_ids is not None
    return (
        num_sequences,
        lengths,
        token_ids,
        array("token_type_ids", "<i4", num_tokens),
        array("priorities", "u1", num_requests),
        array("timeouts_ms", "<u4", num_requests),
    )


_OPTIONAL = frozenset({"token_type_ids", "priorities", "timeouts_ms"})


def span_bound_offsets(message: pb.RequestFrame, lengths: np.ndarray) -> np.ndarray | None:
    """[num_sequences + 1]: where each sequence's bounds start in span_bounds; None without spans.
    Raises InvalidInput when num_spans does not hold one count per sequence."""
    if not message.num_spans:
        return None
    counts = np.frombuffer(message.num_spans, "<u4").astype(np.int64)
    if len(counts) != len(lengths):
        raise InvalidInput(f"a frame's num_spans has {len(counts)} values for {len(lengths)} sequences")
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.where(counts > 0, counts + 1, 0), out=offsets[1:])
    return offsets


def check_kind(kind: int, info: ModelInfo) -> None:
    """Unsupported unless the frame's kind is the model's task; InvalidInput when it names none."""
    asked = _KINDS.get(kind)
    task, name = info.task, info.model_name
    if asked is None:
        raise InvalidInput("a request frame must say its kind: FRAME_KIND_EMBED or FRAME_KIND_SCORE")
    if asked != task:
        if asked == "score":
            raise Unsupported(f"model {name} is a {task} model, not a cross-encoder: it cannot score pairs")
        raise Unsupported(f"model {name} is a {task} model, not an embedder")


def frame_classes(
    num_sequences: np.ndarray, lengths: np.ndarray, priorities: np.ndarray | None
) -> Priority | np.ndarray:
    """Each request's class (what it says, else by its size), or the one class of them all when
    they all say the same (as the gateway's frames do)."""
    if priorities is not None and len(priorities) and priorities.min() == priorities.max():
        said = int(priorities[0])
        if said in (Priority.INTERACTIVE, Priority.BULK):
            return Priority(said)
    seq_offsets = np.zeros(len(num_sequences) + 1, dtype=np.int64)
    np.cumsum(num_sequences, out=seq_offsets[1:])
    token_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=token_offsets[1:])
    tokens = token_offsets[seq_offsets[1:]] - token_offsets[seq_offsets[:-1]]
    classes = np.where(
        (num_sequences <= INTERACTIVE_MAX_SEQUENCES) & (tokens <= INTERACTIVE_MAX_TOKENS),
        Priority.INTERACTIVE,
        Priority.BULK,
    )
    if priorities is not None:
        said_ones = (priorities == Priority.INTERACTIVE) | (priorities == Priority.BULK)
        classes = np.where(said_ones, priorities, classes)
    return classes


def frame_outputs(message: pb.RequestFrame, num_sequences: np.ndarray, info: ModelInfo) -> np.ndarray | None:
    """Each sequence's Output bitmask [num_seqs] uint8 (kembed.proto.outputs), or None when every
    request asks for dense rows alone. InvalidInput for the whole frame when a request asks for
    an output the model lacks, or with span pooling or scores."""
    if not message.outputs:
        if info.sparse_vocabulary:
            check_asks(info, 0)
        return None
    outputs = np.frombuffer(message.outputs, "u1")
    if len(outputs) != len(num_sequences):
        raise InvalidInput(f"a frame's outputs has {len(outputs)} values for {len(num_sequences)} requests")
    if info.sparse_vocabulary:  # its rows as dense ones, compacted when answered
        check_asks(info, outputs)
        return None
    if (outputs <= DENSE).all():
        return None
    if message.kind != pb.FRAME_KIND_EMBED or message.num_spans:
        raise InvalidInput("several outputs are for embed requests without span pooling")
    lacking = int(np.bitwise_or.reduce(outputs)) & ~info.outputs
    if lacking:
        raise InvalidInput(
            f"model {info.model_name} has no {'/'.join(names_of(lacking))} output "
            f"(it has: {', '.join(names_of(info.outputs))})"
        )
    return np.repeat(outputs, num_sequences)


def frame_tasks(
    message: pb.RequestFrame, num_sequences: np.ndarray, lengths: np.ndarray, info: ModelInfo
) -> np.ndarray | None:
    """Each token's task for a model with task adapters (jina_v3.py reads them as its token type
    ids: 0 the default task, t + 1 task t), whatever token types the wire carried; None for a model
    without any. InvalidInput for the whole frame when a request names a task the model lacks."""
    tasks = np.frombuffer(message.tasks, "u1") if message.tasks else None
    if tasks is not None and len(tasks) != len(num_sequences):
        raise InvalidInput(f"a frame's tasks has {len(tasks)} values for {len(num_sequences)} requests")
    if not info.tasks:
        if tasks is not None and tasks.any():
            raise InvalidInput(
                f"model {info.model_name} has no task adapters (a request named task {int(tasks.max())})"
            )
        return None
    if tasks is None:
        return np.zeros(int(lengths.sum()), np.int32)
    if int(tasks.max()) > len(info.tasks):
        raise InvalidInput(
            f"a frame names task {int(tasks.max())}; model {info.model_name} has {len(info.tasks)}: "
            f"{', '.join(info.tasks)}"
        )
    return np.repeat(np.repeat(tasks.astype(np.int32), num_sequences), lengths)


def output_rows(outputs: np.ndarray | None, lengths: np.ndarray, info: ModelInfo) -> dict[str, np.ndarray]:
    """RequestGroup's `outputs` and `rows_per_seq` for sequences with these bitmasks."""
    if outputs is None:
        return {}
    shape = OutputShape(info.dimensions, info.colbert_dimensions, info.hidden_size)
    return {"outputs": outputs, "rows_per_seq": shape.rows_of(lengths, outputs)}


def frame_spans(
    message: pb.RequestFrame, lengths: np.ndarray, seq_mask: np.ndarray | None
) -> list[np.ndarray | None] | None:
    """Per sequence of a group, its span bounds or None (checked already by the frame service)."""
    counts = np.frombuffer(message.num_spans, "<u4")
    bounds = np.frombuffer(message.span_bounds, "<u4")
    offsets = span_bound_offsets(message, np.frombuffer(message.lengths, "<u4"))
    assert offsets is not None
    chosen = np.arange(len(counts)) if seq_mask is None else np.flatnonzero(seq_mask)
    spans: list[np.ndarray | None] = [
        None if counts[s] == 0 else bounds[offsets[s] : offsets[s + 1]].astype(np.int64)
        for s in chosen.tolist()
    ]
    return spans if any(bounds is not None for bounds in spans) else None


def request_problems(message: pb.RequestFrame, arrays: FrameArrays, info: ModelInfo) -> dict[int, str]:
    """What makes each unservable request of the frame so, by its index (validation.py's checks,
    a request at a time): the sequences, token types and span bounds it holds."""
    num_sequences, lengths, token_ids, types, _, _ = arrays
    problems: dict[int, str] = {}
    seq_at, token_at = 0, 0
    spans_at = span_bound_offsets(message, lengths)
    for r, count in enumerate(num_sequences.tolist()):
        own_lengths = lengths[seq_at : seq_at + count]
        num_tokens = int(own_lengths.sum())
        own_ids = token_ids[token_at : token_at + num_tokens]
        problem = sequences_problem(own_ids, own_lengths.astype(np.int64), info)
        if problem is None and types is not None:
            problem = token_types_problem(types[token_at : token_at + num_tokens])
        if problem is None and spans_at is not None:
            try:
                spans_of(
                    np.frombuffer(message.num_spans, "<u4")[seq_at : seq_at + count],
                    np.frombuffer(message.span_bounds, "<u4")[spans_at[seq_at] : spans_at[seq_at + count]],
                    own_lengths,
                )
            except InvalidInput as error:
                problem = str(error)
        if problem is not None:
            problems[r] = problem
        seq_at += count
        token_at += num_tokens
    return problems
