"""Each request model takes its peer API's fields and kembed's listed extensions, nothing else: a
field it does not define is refused naming it (schemas.py), so a field missing here would refuse what
a real client sends, and one added without being listed would be an undocumented extension."""

import pytest
from pydantic import BaseModel

from kembed.gateway.api import openapi
from kembed.gateway.api.cohere import V1EmbedRequest, V2EmbedRequest, V2RerankRequest
from kembed.gateway.api.multi_output import TeiOutputsRequest
from kembed.gateway.api.perplexity import ContextualizedEmbeddingRequest
from kembed.gateway.api.schemas import (
    EmbeddingRequest,
    EmbedRequest,
    InvalidInput,
    RerankRequest,
    TokenizeRequest,
    V1RerankRequest,
    parse,
)
from kembed.gateway.api.tei import DecodeRequest, SimilarityParameters, SimilarityRequest

# The peer APIs' own request fields. OpenAI: its embeddings API reference (the openai SDK's
# `embeddings.create` parameters). TEI: the request schemas of text-embeddings-inference's
# docs/openapi.json (EmbedSparseRequest and EmbedAllRequest alike). Cohere: the JSON bodies of the
# cohere 7.3 SDK's `v1/embed`, `v2/embed`, `v1/rerank`, `v2/rerank` calls. Perplexity: its
# contextualized embeddings API reference.
PEER_FIELDS: dict[type[BaseModel], set[str]] = {
    EmbeddingRequest: {"input", "model", "encoding_format", "dimensions", "user"},
    EmbedRequest: {"inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions"},
    TokenizeRequest: {"inputs", "add_special_tokens", "prompt_name"},
    DecodeRequest: {"ids", "skip_special_tokens"},
    RerankRequest: {"query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction"},
    SimilarityRequest: {"inputs", "parameters"},
    SimilarityParameters: {"truncate", "truncation_direction", "prompt_name"},
    TeiOutputsRequest: {"inputs", "truncate", "truncation_direction", "prompt_name"},
    V1EmbedRequest: {"texts", "images", "model", "input_type", "embedding_types", "truncate"},
    V2EmbedRequest: {
        "texts",
        "images",
        "model",
        "input_type",
        "embedding_types",
        "truncate",
        "inputs",
        "max_tokens",
        "output_dimension",
        "priority",
    },
    V1RerankRequest: {
        "model",
        "query",
        "documents",
        "top_n",
        "rank_fields",
        "return_documents",
        "max_chunks_per_doc",
    },
    V2RerankRequest: {
        "model",
        "query",
        "documents",
        "top_n",
        "max_tokens_per_doc",
        "priority",
        "relevant_spans",
    },
    ContextualizedEmbeddingRequest: {"input", "model", "dimensions", "encoding_format"},
}


@pytest.mark.parametrize("model", list(PEER_FIELDS), ids=lambda model: model.__name__)
def test_a_request_model_takes_its_peers_fields_and_its_listed_extensions(model):
    extensions = set(openapi.EXTENSIONS.get(model.__name__, ()))
    assert not extensions & PEER_FIELDS[model]
    assert set(model.model_fields) == PEER_FIELDS[model] | extensions


def test_every_listed_extension_is_marked_in_the_document():
    schemas = openapi.build("x", has_api_key=False)["components"]["schemas"]
    for name, extensions in openapi.EXTENSIONS.items():
        assert schemas[name]["x-kembed-extensions"] == list(extensions)
        for field in extensions:
            assert schemas[name]["properties"][field]["description"].startswith("kembed's extension")


@pytest.mark.parametrize(
    ("model", "body", "says"),
    [
        (EmbeddingRequest, b'{"input": "x", "dimension": 8}', "dimension (did you mean `dimensions`?)"),
        (EmbeddingRequest, b'{"input": "x", "truncate": false}', "supplied: truncate"),
        (EmbedRequest, b'{"inputs": "x", "truncation": "left"}', "(did you mean `truncate`?)"),
        (V2EmbedRequest, b'{"texts": ["x"], "embeddings_types": ["int8"]}', "did you mean `embedding_types`"),
        (EmbedRequest, b'{"texts": ["x"], "model": "m"}', "arguments supplied: texts, model; inputs: Field"),
    ],
    ids=["dimension", "truncate", "truncation", "cohere", "another-apis-body"],
)
def test_an_unknown_field_is_named_with_the_close_name(model, body, says):
    with pytest.raises(InvalidInput) as refused:
        parse(model, body)
    assert says in refused.value.message


def test_a_cohere_v1_documents_own_fields_are_data_not_options():
    request = parse(V1RerankRequest, b'{"query": "q", "documents": [{"text": "a", "title": "t"}]}')
    assert request.texts == ["a"]
