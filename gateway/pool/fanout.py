"""A request fanned out over the replicas: its sequences split into chunks, each chunk a `Part`
(its id, rows and outputs), the chunks' answers gathered in order with no chunk outliving its
request."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import numpy as np

from kembed.gateway.errors import GatewayError, WorkerFailed
from kembed.gateway.pool.batches import Chunk, Part, num_rows
from kembed.proto.outputs import OutputShape

T = TypeVar("T")


def chunk_parts(
    chunks: Sequence[Chunk],
    sequences: Sequence[np.ndarray],
    type_ids: Sequence[np.ndarray] | None,
    spans: Sequence[np.ndarray | None] | None,
    request_id: str,
    deadline: float,
    priority: int,
    outputs: int = 0,
    shape: OutputShape | None = None,
    is_vocabulary: bool = False,
    task: tuple[str, int] = ("", 0),
) -> list[Part]:
    """One `Part` a chunk: its sequences (and type ids, spans), its id (the request's own for a
    single chunk), its rows (a row a sequence, a row a span, or the `outputs` laid out by `shape`;
    `is_vocabulary`: vocabulary-indexed sparse vectors, as many words as their nonzero weights, -1;
    `task`: a multi-task model's adapter, by name and by its number in a RequestFrame)."""
    parts = []
    for index, chunk in enumerate(chunks):
        own = slice(chunk.start, chunk.stop)
        part = Part(
            request_id if len(chunks) == 1 else f"{request_id}/{index}",
            sequences[own],
            None if type_ids is None else type_ids[own],
            chunk.num_tokens,
            deadline,
            priority=priority,
            owner=request_id,
            task=task[0],
            task_number=task[1],
        )
        if spans is not None:
            part.spans = spans[own]
            part.num_rows = num_rows(part.spans)
        if outputs:
            assert shape is not None, "a request for several outputs was checked against Info"
            lengths = np.array([len(s) for s in part.token_ids])
            part.outputs = outputs
            part.num_rows = (
                -1 if is_vocabulary else int(shape.rows_of(lengths, np.full(len(lengths), outputs)).sum())
            )
        parts.append(part)
    return parts


def joined_rows(rows: Sequence[np.ndarray], kind: str) -> np.ndarray:
    """The chunks' rows as one array, in order; replicas that disagree on its width fail it."""
    if len({own.shape[1] for own in rows}) > 1:
        what = "embedding dimensions" if kind == "embed" else "number of labels"
        raise WorkerFailed(f"worker replicas disagree on the {what}")
    return rows[0] if len(rows) == 1 else np.concatenate(rows)


async def gather_all(coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Results of `coros` in order. The first failure cancels the rest and is raised as itself (not
    as an ExceptionGroup), so no chunk outlives its request; a cancelled request cancels them all
    and ends cancelled, even if a chunk fails meanwhile or in its own cancellation. (A TaskGroup,
    used before, gives a child's error priority over its parent's cancel: a request whose client
    left, or whose deadline passed, as a chunk failed was answered, and counted, as that chunk's
    error instead of 499 or 504: the pacing window's ValueError made it a 500.)"""
    if len(coros) == 1:
        return [await coros[0]]
    tasks = [asyncio.ensure_future(coro) for coro in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        await _cancelled(tasks)
        raise
    failures = [e for t in tasks if t.done() and not t.cancelled() and (e := t.exception()) is not None]
    if failures:
        await _cancelled(tasks)
        known = [e for e in failures if isinstance(e, GatewayError)]
        raise (known or failures)[0] from None
    return [task.result() for task in tasks]


async def _cancelled(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Every task of `tasks` cancelled and ended (their own errors retrieved, not raised)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
