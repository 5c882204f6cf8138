"""Request bodies of the OpenAI- and TEI-shaped routes, validated by pydantic straight from bytes.

Models are strict (a number is not a string, 1 is not true) and ignore unknown fields, as both APIs'
clients send extras (`user`, vendor options) that do not change the answer.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar, cast

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kembed.gateway.errors import InvalidInput
from kembed.gateway.tokenizing.tokenization import Input
from kembed.gateway.vectors import EncodingFormat
from kembed.proto.model_files import Direction

# A text, a list of texts, one pre-tokenized sequence (ints), or a list mixing texts and sequences.
Inputs = str | list[int] | list[str | list[int]]
TruncationDirection = Literal["right", "left", "Right", "Left"]

_STRICT = ConfigDict(strict=True, extra="ignore")
_INPUT_FORMS = "a string, a list of strings, a list of token ids, or a list of lists of token ids"
_INPUT_FIELDS = {
    "input": _INPUT_FORMS,
    "inputs": _INPUT_FORMS,
    "texts": "a list of strings",
    "documents": 'a list of strings or of objects {"text": string}',
}


class EmbeddingRequest(BaseModel):
    """`POST /v1/embeddings`, OpenAI's shape plus `prompt_name`, and Perplexity's `encoding_format`s
    `base64_int8` and `base64_binary`."""

    model_config = _STRICT
    input: Inputs
    model: str | None = None
    encoding_format: EncodingFormat | None = None
    dimensions: int | None = None
    user: str | None = None
    prompt_name: str | None = None


class EmbedRequest(BaseModel):
    """`POST /embed`, text-embeddings-inference's shape plus `dimensions`."""

    model_config = _STRICT
    inputs: Inputs
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: TruncationDirection | None = None
    prompt_name: str | None = None
    dimensions: int | None = None


class TokenizeRequest(BaseModel):
    """`POST /tokenize`, TEI's shape."""

    model_config = _STRICT
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class RerankRequest(BaseModel):
    """`POST /rerank`, TEI's shape."""

    model_config = _STRICT
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: TruncationDirection | None = None


class RerankDocument(BaseModel):
    """A document given as an object, as Cohere's v1 API allows; other fields are ignored."""

    model_config = _STRICT
    text: str


class V1RerankRequest(BaseModel):
    """`POST /v1/rerank`, the shape Cohere's and Jina's rerank APIs share (vLLM and Infinity serve it).

    Scores are always relevance probabilities (sigmoid of the logit), never raw logits; fields for
    other rerankers' options (`rank_fields`, `max_chunks_per_doc`) are ignored."""

    model_config = _STRICT
    query: str
    documents: list[str | RerankDocument]
    model: str | None = None
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False  # Cohere v1's default

    @property
    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


M = TypeVar("M", bound=BaseModel)


def _is_whole_float(value: object) -> bool:
    return isinstance(value, float) and value.is_integer()


def _whole_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole_floats_as_ints(item) for item in value]
    if isinstance(value, dict):
        return {key: _whole_floats_as_ints(item) for key, item in value.items()}
    return value


def parse(model: type[M], body: bytes) -> M:
    """`body` validated as `model`; InvalidInput naming the first bad field's location.

    A whole number written as a float (`2.0`) is taken where an integer is: JSON Schema, and so the
    OpenAPI document, calls it an integer. The strict parse refuses it (no request model has a
    float field), so such a body is parsed again with those numbers as ints: only on that path."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        if any(p["type"] == "int_type" and _is_whole_float(p.get("input")) for p in error.errors()):
            try:
                return model.model_validate(_whole_floats_as_ints(orjson.loads(body)))
            except ValidationError as again:
                error = again
        problems = error.errors(include_url=False, include_input=False)
        if problems and problems[0]["type"] == "json_invalid":
            raise InvalidInput(f"malformed JSON body: {problems[0]['msg']}") from None
        described = "; ".join(
            f"{'.'.join(str(part) for part in p['loc']) or 'body'}: {p['msg']}" for p in problems[:4]
        )
        field = str(problems[0]["loc"][0]) if problems and problems[0]["loc"] else None
        if field in _INPUT_FIELDS and len(problems[0]["loc"]) > 1:
            # The union's per-branch errors alone read as noise; say first what is accepted.
            described = f"{field} must be {_INPUT_FIELDS[field]} ({described})"
        raise InvalidInput(f"invalid request: {described}", param=field) from None


def as_input_list(inputs: Inputs) -> list[Input]:
    """The request's inputs as a list: a bare string or a bare list of ints is one input."""
    if isinstance(inputs, str):
        return [inputs]
    if inputs and all(isinstance(item, int) for item in inputs):
        return [cast(list[int], inputs)]  # all ints: one input of token ids
    return list(cast(list[Input], inputs))  # the rest: a list of inputs


def as_direction(direction: TruncationDirection | None) -> Direction | None:
    """TEI's capitalised `Right`/`Left` and the lower-case spellings, as one."""
    return None if direction is None else cast(Direction, direction.lower())  # Right/Left lowered
