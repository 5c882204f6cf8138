"""Several outputs per text from one pass (BGE-M3's dense, sparse and ColBERT; any embedder's token
vectors): TEI's `/embed_sparse` and `/embed_all`, and `/v1/embeddings` with the `outputs` field.

Sparse vectors are built here from the worker's per-token weights, as FlagEmbedding does for
BGE-M3: each token id's largest weight, zero weights and the tokenizer's cls, eos, pad and unk
tokens dropped. A SPLADE model's come from the worker whole, its nonzero (vocabulary id, weight)
pairs, as sentence-transformers' SparseEncoder computes them. `/v1/embeddings` answers them as
`{"indices", "values"}` (ids increasing: what Qdrant's and Milvus's sparse vectors take), TEI's
route as `[{"index", "value"}]`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from kembed.gateway.answer_size import VALUE_BYTES
from kembed.gateway.api.responses import json_response
from kembed.gateway.api.schemas import (
    _STRICT,
    EmbeddingRequest,
    Inputs,
    OutputName,
    TruncationDirection,
    as_direction,
    as_input_list,
    parse,
)
from kembed.gateway.api.tei import BodyReader
from kembed.gateway.service.service import PRIORITY_HEADER, TEI_OUTPUTS, EmbeddingService
from kembed.gateway.vectors import encode, finish
from kembed.proto.outputs import KINDS, SPARSE, TOKENS


class TeiOutputsRequest(BaseModel):
    """`POST /embed_sparse` and `POST /embed_all`, TEI's shape."""

    model_config = _STRICT
    inputs: Inputs
    truncate: bool | None = None
    truncation_direction: TruncationDirection | None = None
    prompt_name: str | None = None


class TeiSparseValue(BaseModel):
    """One entry of a sparse vector, TEI's shape."""

    index: int
    value: float


def sparse_vector(
    row: dict[str, np.ndarray], ids: np.ndarray, skip: frozenset[int]
) -> tuple[np.ndarray, np.ndarray]:
    """A sequence's sparse vector (ids increasing, their weights): a vocabulary-indexed model's
    (SPLADE: the worker's nonzero pairs, as sentence-transformers' SparseEncoder gives them, special
    tokens kept), else `lexical` of its per-token weights."""
    if "sparse_ids" in row:
        return row["sparse_ids"], row["sparse"]
    return lexical(row["sparse"], ids, skip)


def lexical(weights: np.ndarray, ids: np.ndarray, skip: frozenset[int]) -> tuple[np.ndarray, np.ndarray]:
    """(ids increasing, their weights): each id's largest positive weight, `skip` ids dropped."""
    keep = (weights > 0) & ~np.isin(ids, list(skip))
    ids, weights = ids[keep], weights[keep]
    unique, inverse = np.unique(ids, return_inverse=True)
    best = np.zeros(len(unique), np.float32)
    np.maximum.at(best, inverse, weights)
    return unique.astype(np.int64), best


class OutputRoutes:
    """The handlers, over the service the other routes share and their size-capped body reader."""

    def __init__(self, service: EmbeddingService, read_body: BodyReader) -> None:
        self.service = service
        self.read_body = read_body

    def _skip(self) -> frozenset[int]:
        tokenization = self.service.tokenization
        return tokenization.token_ids(tokenization.spec.lexical_skip)

    async def _tei(self, request: Request, outputs: int) -> tuple[Any, list[np.ndarray]]:
        body = parse(TeiOutputsRequest, await self.read_body(request))
        got = await self.service.embed_outputs(
            as_input_list(body.inputs),
            outputs,
            truncate=body.truncate,
            direction=as_direction(body.truncation_direction),
            prompt_name=body.prompt_name,
            param="inputs",
            priority=request.headers.get(PRIORITY_HEADER),
            offered=TEI_OUTPUTS,
        )
        return got.rows, list(got.sequences)

    async def embed_sparse(self, request: Request) -> Response:
        rows, sequences = await self._tei(request, SPARSE)
        skip = self._skip()
        answer = []
        for row, ids in zip(rows, sequences, strict=True):
            indices, values = sparse_vector(row, ids, skip)
            answer.append(
                [{"index": int(i), "value": float(v)} for i, v in zip(indices, values, strict=True)]
            )
        return json_response(answer)

    async def embed_all(self, request: Request) -> Response:
        rows, _ = await self._tei(request, TOKENS)
        return json_response([row["tokens"] for row in rows])

    async def openai(self, request: Request, names: list[OutputName], parsed: EmbeddingRequest) -> Response:
        """`/v1/embeddings` with `outputs`: each item holds `embedding` (dense, as without the field),
        `sparse_embedding` ({indices, values}) and `colbert_embedding` (a vector per token but the
        first, each in `encoding_format`) for the outputs asked for. `dimensions` cuts the dense and
        the ColBERT vectors alike, each renormalised, as FlagEmbedding's `truncate_dim` does;
        checked before the model runs, as the outputs and the answer's size are."""
        outputs = 0
        for name in names:
            outputs |= KINDS[name]
        service = self.service
        got = await service.embed_outputs(
            as_input_list(parsed.input),
            outputs,
            truncate=None,
            direction=None,
            prompt_name=parsed.prompt_name,
            priority=request.headers.get(PRIORITY_HEADER),
            dimensions=parsed.dimensions,
            value_bytes=VALUE_BYTES[parsed.encoding_format or "float"],
        )
        info = service.worker_info()
        items: list[dict[str, Any]] = [{"object": "embedding", "index": i} for i in range(len(got.rows))]
        if "dense" in names:
            dense = finish(
                np.stack([r["dense"] for r in got.rows]),
                dimensions=parsed.dimensions,
                normalize=info.normalize,
            )
            for item, vector in zip(items, encode(dense, parsed.encoding_format), strict=True):
                item["embedding"] = vector
        if "sparse" in names:
            skip = self._skip()
            for item, row, ids in zip(items, got.rows, got.sequences, strict=True):
                indices, values = sparse_vector(row, ids, skip)
                item["sparse_embedding"] = {"indices": indices.tolist(), "values": values.tolist()}
        if "colbert" in names:
            for item, row in zip(items, got.rows, strict=True):
                # the worker's vectors are unit length: cut ones are made so again
                vectors = finish(
                    row["colbert"], dimensions=parsed.dimensions, normalize=parsed.dimensions is not None
                )
                item["colbert_embedding"] = encode(vectors, parsed.encoding_format)
        usage = {"prompt_tokens": got.num_tokens, "total_tokens": got.num_tokens}
        return json_response(
            {"object": "list", "data": items, "model": service.served_names[0], "usage": usage}
        )
