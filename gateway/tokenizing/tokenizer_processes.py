"""Bulk requests' texts tokenized in child processes, off the process that serves HTTP.

Tokenizing a 100-text indexing request costs ~40 ms of CPU. On the tokenization threads its Rust part
releases the GIL, but its Python part (cutting truncation windows, one array per Encoding) holds it in
slices of up to the interpreter's switch interval, and the library's own thread pool competes with the
event loop for the cores: a query served meanwhile waits. Here a bulk request's texts go to a small
pool of processes instead, each with the same tokenizers loaded once at its start, which send back one
int32 array of all the ids and one length per text: the loop's process pays only the pickling of the
texts and of that answer. Small and interactive requests stay where they were (tokenization.py): a
hand-off to another process costs more than a query's tokenizing. (Running the children at a lower
CPU priority was tried on a 2-core machine: nice 10 starved bulk, to 16 % of its throughput beside
queries; nice 5 changed nothing measurable.)

The ids are those of the threads' path: the children call the same functions on tokenizers built
the same way.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import ClassVar

import numpy as np
from tokenizers import Tokenizer

from kembed.gateway.tokenizing.tokenizer_load import (
    encode_ids,
    encode_ids_truncated,
    load_tokenizer,
    truncating_tokenizer,
)
from kembed.proto.model_files import Direction, ModelSpec

log = logging.getLogger(__name__)


class _Loaded:
    """The child's tokenizers, as Tokenization builds them (set once by `_start`)."""

    untruncated: Tokenizer
    truncating: ClassVar[dict[Direction, Tokenizer]] = {}


def _start(spec: ModelSpec) -> None:
    """Each child's initializer: no Ctrl-C tracebacks (the gateway stops the pool), the tokenizers
    loaded once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _Loaded.untruncated = load_tokenizer(spec)
    if spec.max_seq_length is not None:
        for side in ("right", "left"):
            _Loaded.truncating[side] = truncating_tokenizer(_Loaded.untruncated, spec.max_seq_length, side)


def _encode_in_child(
    texts: list[str], truncation: tuple[int, Direction] | None
) -> tuple[np.ndarray, np.ndarray]:
    """All ids of `texts` concatenated, and each text's count: one array each to pickle back."""
    if truncation is None:
        arrays = encode_ids(_Loaded.untruncated, texts)
    else:
        limit, side = truncation
        arrays = encode_ids_truncated(_Loaded.truncating[side], _Loaded.untruncated, texts, limit, side)
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int32), lengths


class TokenizerProcesses:
    """`num_processes` child processes (spawned: no copy of the gateway's threads and sockets) that
    tokenize texts as the tokenization threads would. `close()` stops them; a child that dies
    breaks the pool, and the gateway then tokenizes on its threads again (`is_broken`)."""

    def __init__(self, spec: ModelSpec, num_processes: int) -> None:
        self._spec = spec
        self._executor = ProcessPoolExecutor(
            num_processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(spec,),
        )
        self.is_broken = False
        self.num_requests = 0  # requests tokenized here since start

    async def encode(self, texts: list[str], truncation: tuple[int, Direction] | None) -> list[np.ndarray]:
        """One int32 array per text: truncated to `truncation`'s (max_length, side) as
        `encode_ids_truncated` does, or whole (`encode_ids`) when None. BrokenProcessPool if a
        child died (the pool is then marked broken)."""
        loop = asyncio.get_running_loop()
        try:
            ids, lengths = await loop.run_in_executor(self._executor, _encode_in_child, texts, truncation)
        except BrokenProcessPool:
            if not self.is_broken:
                log.error("a bulk tokenization process died; bulk requests are tokenized on threads now")
            self.is_broken = True
            raise
        self.num_requests += 1
        return np.split(ids, np.cumsum(lengths[:-1])) if len(lengths) else []

    def close(self) -> None:
        """Stops the children: those idle at once, a busy one after its current request."""
        self._executor.shutdown(wait=True, cancel_futures=True)
