"""What the server checks in each request field, written into the OpenAPI document's request schemas.

pydantic's schemas say a field's type; the handlers check more: `dimensions` within the model's, token
ids within its vocabulary, lists not empty and at most `--max-client-batch-size` long, `prompt_name`
one of the model's prompts, `model` one of the served names, Cohere's text-only inputs. Those checks
stay where they are (their messages say what to send instead); this module states the same rules in
the schema, from the facts they are checked against (`Served`), so that a request valid by the
document is one the server takes and a generated client refuses what the server would.

Left out, as no schema can state them: how many tokens a text has (a text over the model's limit
with truncation off, or over Cohere's `max_tokens` with `truncate: NONE`, is 413; a chunk of
`/v1/contextualizedembeddings` with no tokens, whitespace only say, is 400), totals across lists
(`/decode`'s ids, the chunks of all documents), and the body's byte cap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kembed.gateway.config import GatewayConfig

OUTPUT_NAMES = ("dense", "sparse", "colbert")  # what `outputs` names (schemas.OutputName)

Schema = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Served:
    """The facts a request is checked against: the workers' (None until one has answered) and the
    gateway's own."""

    model_names: tuple[str, ...]
    prompt_names: tuple[str, ...]
    dimensions: int | None
    vocab_size: int | None
    max_client_batch_size: int
    max_tokenize_chars: int
    max_tokenize_tokens: int
    max_context_documents: int
    max_context_chunks: int
    # the outputs `/v1/embeddings`' `outputs` may ask for (the model's, of dense, sparse, colbert);
    # None until a worker has answered
    outputs: tuple[str, ...] | None = None

    @classmethod
    def of(
        cls,
        config: GatewayConfig,
        model_names: tuple[str, ...],
        prompt_names: tuple[str, ...],
        dimensions: int | None,
        vocab_size: int | None,
        outputs: tuple[str, ...] | None = None,
    ) -> Served:
        return cls(
            model_names=model_names,
            prompt_names=tuple(sorted(prompt_names)),
            dimensions=dimensions or None,
            vocab_size=vocab_size or None,
            max_client_batch_size=config.max_client_batch_size,
            max_tokenize_chars=config.max_tokenize_chars,
            max_tokenize_tokens=config.max_tokenize_tokens,
            max_context_documents=config.max_context_documents,
            max_context_chunks=config.max_context_chunks,
            outputs=None if outputs is None else tuple(o for o in OUTPUT_NAMES if o in outputs),
        )


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _allows_null(schema: Schema) -> bool:
    return {"type": "null"} in schema.get("anyOf", [])


def _bounded(schema: Schema, **bounds: int | None) -> Schema:
    return schema | {name: value for name, value in bounds.items() if value is not None}


def _token_ids(
    served: Served, max_items: int | None = None, min_items: int = 1, *, is_input: bool = True
) -> Schema:
    top = served.vocab_size - 1 if served.vocab_size else None
    items = _bounded({"type": "integer", "minimum": 0}, maximum=top)
    schema: Schema = {"type": "array", "items": items, "minItems": min_items}
    if is_input:  # what the gateway embeds (GatewayConfig.token_ids), not what /decode reads
        schema["description"] = (
            "token ids of this model's own tokenizer, framed by its special tokens as it frames a "
            "sequence (unless the gateway runs with --token-ids any)"
        )
    return _bounded(schema, maxItems=max_items)


def _texts(served: Served, item: Schema | None = None, max_items: int | None = None) -> Schema:
    """A non-empty list of inputs, at most a batch."""
    limit = served.max_client_batch_size if max_items is None else max_items
    return {"type": "array", "items": item or {"type": "string"}, "minItems": 1, "maxItems": limit}


def _inputs(served: Served) -> Schema:
    """OpenAI's and TEI's `input(s)`: a text, one sequence of token ids, or a list of either."""
    one = [{"type": "string"}, _token_ids(served)]
    return {"anyOf": [*one, _texts(served, {"anyOf": one})]}


def _model(served: Served) -> Schema:
    return _nullable({"type": "string", "enum": list(served.model_names)})


def _prompt_name(served: Served) -> Schema:
    return _nullable({"type": "string", "enum": list(served.prompt_names)})


def _dimensions(served: Served) -> Schema:
    return _nullable(_bounded({"type": "integer", "minimum": 1}, maximum=served.dimensions))


def _outputs(served: Served) -> Schema:
    """`/v1/embeddings`' extension field (gateway/api/multi_output.py): the model's outputs by name, at
    least one; null or left out is the dense answer alone, where the model has one."""
    names = OUTPUT_NAMES if served.outputs is None else served.outputs
    listed: Schema = {"type": "array", "items": {"type": "string", "enum": list(names)}, "minItems": 1}
    schema = listed if served.outputs is not None and "dense" not in served.outputs else _nullable(listed)
    return schema | {
        "title": "Outputs",
        "description": "Outputs each item carries from one pass: `embedding` (dense), "
        "`sparse_embedding` ({indices, values}), `colbert_embedding` (a vector per token but the first).",
    }


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _tokenize_inputs(served: Served) -> Schema:
    text = {"type": "string", "maxLength": served.max_tokenize_chars}
    return {"anyOf": [text, _texts(served, text)]}


def _decode_ids(served: Served) -> Schema:
    """One sequence of ids or several, each at most /tokenize's cap (the cap is on all together)."""
    sequence = _token_ids(served, served.max_tokenize_tokens, min_items=0, is_input=False)
    return {"anyOf": [sequence, {"type": "array", "items": sequence, "maxItems": served.max_tokenize_tokens}]}


def _documents(served: Served) -> Schema:
    """Perplexity's `input`: documents, each a non-empty list of chunks with text."""
    chunks = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
    chunks["maxItems"] = served.max_context_chunks
    return _texts(served, chunks, max_items=served.max_context_documents)


def _cohere_input_type(served: Served) -> Schema:
    return _nullable(
        {"type": "string", "enum": ["search_query", "search_document", "classification", "clustering"]}
    )


def _no_images(served: Served) -> Schema:
    return _nullable({"type": "array", "maxItems": 0})  # text models only


def _text_content(served: Served) -> Schema:
    return {"type": "array", "items": _ref("_TextContent"), "minItems": 1}  # text parts only


def _no_span_mode(served: Served) -> Schema:
    return _nullable({"type": "object", "properties": {"mode": {"not": {"const": "enabled"}}}})


def _rerank_documents(served: Served) -> Schema:
    return _texts(served, {"anyOf": [{"type": "string"}, _ref("RerankDocument")]})


def _rank_fields(served: Served) -> Schema:
    text = {"type": "string", "const": "text"}  # Cohere v1's default, the one field ranked
    return _nullable({"type": "array", "items": text, "minItems": 1, "maxItems": 1})


def _not_served(served: Served) -> Schema:
    return {"type": "null"}  # a peer API's option kembed refuses (docs/api.md): null or left out


def _pair_sentences(served: Served) -> Schema:
    return _texts(served, max_items=served.max_client_batch_size - 1)  # the source is embedded too


def _nullable_texts(served: Served) -> Schema:
    return _nullable(_texts(served))


def _v2_inputs(served: Served) -> Schema:
    return _nullable(_texts(served, _ref("V2EmbedInput")))


# Per request model, per field: the field's schema as the server checks it.
_FIELDS: dict[str, dict[str, Callable[[Served], Schema]]] = {
    "EmbeddingRequest": {
        "input": _inputs, "model": _model, "dimensions": _dimensions, "prompt_name": _prompt_name,
        "outputs": _outputs,
    },
    "EmbedRequest": {"inputs": _inputs, "dimensions": _dimensions, "prompt_name": _prompt_name},
    "TeiOutputsRequest": {"inputs": _inputs, "prompt_name": _prompt_name},  # /embed_sparse, /embed_all
    "TokenizeRequest": {"inputs": _tokenize_inputs, "prompt_name": _prompt_name},
    "SimilarityRequest": {"prompt_name": _prompt_name},
    "SimilarityParameters": {"prompt_name": _prompt_name},
    "SentencePair": {"sentences": _pair_sentences},
    "DecodeRequest": {"ids": _decode_ids},
    "RerankRequest": {"texts": _texts},
    "V1RerankRequest": {
        "model": _model, "documents": _rerank_documents, "rank_fields": _rank_fields,
        "max_chunks_per_doc": _not_served,
    },
    # `texts` and `inputs`: exactly one of the two (the `oneOf` below)
    "V2EmbedRequest": {
        "model": _model, "texts": _nullable_texts, "inputs": _v2_inputs, "images": _no_images,
        "input_type": _cohere_input_type, "output_dimension": _dimensions,
    },
    "V2EmbedInput": {"content": _text_content},
    "V1EmbedRequest": {
        "model": _model, "texts": _texts, "images": _no_images, "input_type": _cohere_input_type,
    },
    "V2RerankRequest": {"model": _model, "documents": _texts, "relevant_spans": _no_span_mode},
    "ContextualizedEmbeddingRequest": {"model": _model, "dimensions": _dimensions, "input": _documents},
}  # fmt: skip


_SIMILARITY_OPTIONS = ("truncate", "truncation_direction", "prompt_name")


def _once(name: str) -> Schema:
    """Not both `parameters.<name>` and `<name>` beside `inputs` (a null is not given)."""
    given: Schema = {"not": {"type": "null"}}
    return {
        "not": {
            "required": [name, "parameters"],
            "properties": {
                name: given,
                "parameters": {"type": "object", "required": [name], "properties": {name: given}},
            },
        }
    }


# Rules across a model's fields: Cohere's `texts` or `inputs`, exactly one of them sent (not null);
# v1's `texts` (the v1 SDK's images are refused); a similarity option in one place of its two.
_WHOLE: dict[str, Schema] = {
    "SimilarityRequest": {
        "allOf": [_once(name) for name in ("truncate", "truncation_direction", "prompt_name")]
    },
    "V1EmbedRequest": {"required": ["texts"]},
    "V2EmbedRequest": {
        "oneOf": [
            {"required": [sent], "properties": {sent: {"type": "array"}, other: {"type": "null"}}}
            for sent, other in (("texts", "inputs"), ("inputs", "texts"))
        ]
    },
}


def constrain(schemas: dict[str, Schema], served: Served) -> None:
    """`schemas` (the document's components, by model name) with every field in `_FIELDS` replaced
    by the rule the server checks it by; each field's title and description kept, and its default
    unless that is a null the rule does not take (a field that must be sent, or left out)."""
    for model, fields in _FIELDS.items():
        schema = schemas.get(model)
        if schema is None:
            continue
        properties = schema["properties"]
        for name, rule in fields.items():
            checked = rule(served)
            declared = properties.get(name, {})  # an extension field parsed apart has none (outputs)
            kept = {key: declared[key] for key in ("title", "description") if key in declared}
            if "default" in declared and (declared["default"] is not None or _allows_null(checked)):
                kept["default"] = declared["default"]  # a null default only where null is taken
            properties[name] = kept | checked
        schema.update(_WHOLE.get(model, {}))
    # a model without a dense output (SPLADE) answers `/v1/embeddings` only for the outputs it has
    embeddings = schemas.get("EmbeddingRequest")
    if embeddings is not None and served.outputs is not None and "dense" not in served.outputs:
        embeddings["required"] = [*embeddings.get("required", []), "outputs"]
