"""Request bodies of the OpenAI- and TEI-shaped routes, validated by pydantic straight from bytes.

Models are strict (a number is not a string, 1 is not true) and refuse a field they do not define,
naming it, as the OpenAI API does (400 "Unrecognized request argument supplied: dimension"): a
misspelt option answered as if unsaid is a wrong answer nobody notices. Every field the real clients
send is defined (the OpenAI SDK's `user`, Cohere's and Hugging Face's own), and so is each extension
kembed takes (`prompt_name`, `outputs`, `dimensions` on TEI's `/embed`); docs/api.md lists them.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal, TypeVar, cast, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kembed.gateway.errors import InvalidInput
from kembed.gateway.tokenizing.tokenization import Input
from kembed.gateway.vectors import EncodingFormat
from kembed.proto.model_files import Direction

# A text, a list of texts, one pre-tokenized sequence (ints), or a list mixing texts and sequences.
Inputs = str | list[int] | list[str | list[int]]
TruncationDirection = Literal["right", "left", "Right", "Left"]

_STRICT = ConfigDict(strict=True, extra="forbid")
OutputName = Literal["dense", "sparse", "colbert"]  # what `/v1/embeddings`' `outputs` names
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
    prompt_name: str | None = Field(
        default=None, description="the model's prompt of that name, put before each text"
    )
    outputs: list[OutputName] | None = Field(
        default=None, min_length=1, description="the outputs each item carries from one pass"
    )


class EmbedRequest(BaseModel):
    """`POST /embed`, text-embeddings-inference's shape (with its `dimensions`), and `encoding_format`
    as huggingface_hub's `feature_extraction` may send it: `float` alone, the answer's only form."""

    model_config = _STRICT
    inputs: Inputs
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: TruncationDirection | None = None
    prompt_name: str | None = None
    dimensions: int | None = None
    encoding_format: Literal["float"] | None = Field(
        default=None,
        description="huggingface_hub's feature_extraction option: TEI's routes answer floats "
        "(`/v1/embeddings` takes base64)",
    )


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
    """A document given as an object, as Cohere's v1 API allows. Its other fields are the document's
    data, not request options: kept out of the ranking, as Cohere ranks `text` alone by default."""

    model_config = ConfigDict(strict=True, extra="allow")
    text: str


class V1RerankRequest(BaseModel):
    """`POST /v1/rerank`, the shape Cohere's and Jina's rerank APIs share (vLLM and Infinity serve it).

    Scores are always relevance probabilities (sigmoid of the logit), never raw logits. Cohere v1's
    `rank_fields` is taken as `["text"]` alone, what is ranked (other fields: 400); its
    `max_chunks_per_doc` is refused (400): a document is never split into chunks scored apart,
    it is truncated to the model's limit."""

    model_config = _STRICT
    query: str
    documents: list[str | RerankDocument]
    model: str | None = None
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False  # Cohere v1's default
    rank_fields: list[str] | None = Field(
        default=None, description='Cohere v1\'s: `["text"]` alone, the one field ranked'
    )
    max_chunks_per_doc: int | None = Field(
        default=None,
        description="Cohere v1's: not served (a document is truncated to the model's limit, not "
        "split into chunks scored apart); null or left out",
    )

    def check_options(self) -> None:
        """InvalidInput for Cohere v1's options kembed does not serve, naming each (docs/api.md)."""
        if self.rank_fields is not None and self.rank_fields != ["text"]:
            raise InvalidInput(
                f"rank_fields {self.rank_fields} is not supported: documents are ranked by their "
                '`text` alone (send ["text"] or leave it out)',
                param="rank_fields",
            )
        if self.max_chunks_per_doc is not None:
            raise InvalidInput(
                "max_chunks_per_doc is not supported: a document is not split into chunks scored "
                "apart, it is truncated to the model's limit (leave it out)",
                param="max_chunks_per_doc",
            )

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


def _field_names(model: type[BaseModel]) -> set[str]:
    """The fields of `model` and of every request model inside it: what a misspelt name is likened to."""
    names: set[str] = set()
    seen: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, info in current.model_fields.items():
            names.add(name)
            todo.extend(_models_in(info.annotation))
    return names


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def unrecognized(model: type[BaseModel], names: list[str], missing: list[str]) -> InvalidInput:
    """OpenAI's refusal of fields it does not define ("Unrecognized request argument supplied"),
    each name with the close field name it likely meant, if there is one; and the required fields
    `missing`, as a body meant for another API (litellm's cohere/ provider posting to TEI's root
    route) lacks them."""
    known = sorted(_field_names(model))
    said = []
    for name in names:
        last = name.rpartition(".")[2]
        close = difflib.get_close_matches(last, known, n=1, cutoff=0.75)
        close = close or [k for k in known if len(last) >= 4 and (k.startswith(last) or last.startswith(k))]
        said.append(f"{name} (did you mean `{close[0]}`?)" if close else name)
    plural = "s" if len(names) > 1 else ""
    message = f"Unrecognized request argument{plural} supplied: {', '.join(said)}"
    if missing:
        message += f"; {', '.join(missing)}: Field required"
    return InvalidInput(message, param=names[0])


def parse(model: type[M], body: bytes) -> M:
    """`body` validated as `model`; InvalidInput naming the first bad field's location, or every
    field the model does not define (`unrecognized`).

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
        extra = [".".join(str(part) for part in p["loc"]) for p in problems if p["type"] == "extra_forbidden"]
        if extra:  # said first: a misspelt option explains the other errors, if any
            missing = [str(p["loc"][0]) for p in problems if p["type"] == "missing" and len(p["loc"]) == 1]
            raise unrecognized(model, extra, missing) from None
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
