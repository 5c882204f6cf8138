"""LLM rerankers (Qwen3-Reranker, mxbai-rerank-v2 shapes) as sentence-transformers 6 saves them, a
causal LM with LogitScore and a chat template: the gateway's tokenization of each (query, document)
pair through the template, then kembed's CPU engine, against `CrossEncoder(dir).predict` on the same
directory (scores within 1 %), for ragged batches of pairs together; ids equal to the
CrossEncoder's own, truncation and the default prompt included."""

import asyncio
import json

import numpy as np
import pytest
import torch
from decoder_dirs import MXBAI_TEMPLATE, QWEN3_RERANKER_TEMPLATE, reranker_dir
from sentence_transformers import CrossEncoder

from kembed.gateway.tokenizing.tokenization import Tokenization
from kembed.proto.model_files import load_model_spec
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.errors import InvalidInput

QUERY = "what is the capital of france?"
DOCUMENTS = [
    "paris",
    "paris is the capital and the largest city of france " * 2,
    "the quick brown fox jumps over the lazy dog",
    "yes",
    "kembed serves text embeddings and relevance scores from GPU workers, " * 3,
]


def gateway_pairs(path, query: str, documents: list[str], truncate: bool = True) -> list[np.ndarray]:
    tokenization = Tokenization(load_model_spec(path), num_threads=1)
    try:
        ids, _ = asyncio.run(tokenization.encode_pairs(query, documents, truncate=truncate, direction=None))
    finally:
        tokenization.close()
    return ids


def scores_of(path, ids: list[np.ndarray], backend: str = "sdpa") -> np.ndarray:
    engine = load_engine(WorkerConfig(model=path, attention_backend=backend, device="cpu"))
    assert (engine.info.task, engine.info.dimensions, engine.info.pooling) == ("score", 1, "")
    lengths = np.array([len(row) for row in ids], np.int32)
    return engine.step(engine.pack(np.concatenate(ids), lengths)).wait()[:, 0]


def cross_encoder_ids(path, query: str, documents: list[str]) -> list[list[int]]:
    model = CrossEncoder(str(path), device="cpu")
    features = model[0].preprocess([(query, d) for d in documents], prompt=model._resolve_prompt(None, None))
    return [
        row[mask.bool()].tolist()
        for row, mask in zip(features["input_ids"], features["attention_mask"], strict=True)
    ]


CASES = {
    "qwen3-reranker-untied": ("qwen3", QWEN3_RERANKER_TEMPLATE, {}),
    "qwen3-reranker-tied": ("qwen3", QWEN3_RERANKER_TEMPLATE, {"tied": True}),
    "mxbai-rerank-v2-qwen2-tied": ("qwen2", MXBAI_TEMPLATE, {"tied": True}),
    "qwen3-true-token-only": ("qwen3", QWEN3_RERANKER_TEMPLATE, {"only_true": True}),
    "qwen3-default-prompt-as-system": (
        "qwen3",
        QWEN3_RERANKER_TEMPLATE,
        {"prompts": {"colour": "Rank by colour"}, "default_prompt_name": "colour"},
    ),
    "qwen3-truncated-keeps-the-template-tail": ("qwen3", QWEN3_RERANKER_TEMPLATE, {"max_length": 90}),
}


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_llm_reranker_scores_match_cross_encoder_predict(tmp_path, case, backend):
    family, template, kwargs = case
    path = reranker_dir(tmp_path, family, template, **kwargs)
    ids = gateway_pairs(path, QUERY, DOCUMENTS)
    assert [row.tolist() for row in ids] == cross_encoder_ids(path, QUERY, DOCUMENTS)
    ours = scores_of(path, ids, backend)
    model = CrossEncoder(str(path), device="cpu")
    raw = model.predict(
        [(QUERY, d) for d in DOCUMENTS], activation_fn=torch.nn.Identity(), batch_size=len(DOCUMENTS)
    )
    np.testing.assert_allclose(ours, raw, rtol=1e-2, atol=1e-4)
    probabilities = model.predict([(QUERY, d) for d in DOCUMENTS])  # its saved activation: sigmoid
    np.testing.assert_allclose(1 / (1 + np.exp(-ours)), probabilities, rtol=1e-2, atol=1e-5)
    if "max_length" in kwargs:  # the long documents were cut, and still end in the template's tail
        assert max(len(row) for row in ids) == kwargs["max_length"]
        assert all(row[-5:].tolist() == ids[0][-5:].tolist() for row in ids)


def test_pairs_alone_score_as_in_a_batch(tmp_path):
    path = reranker_dir(tmp_path, "qwen3", QWEN3_RERANKER_TEMPLATE)
    ids = gateway_pairs(path, QUERY, DOCUMENTS)
    together = scores_of(path, ids)
    alone = np.concatenate([scores_of(path, [row]) for row in ids])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)
    assert np.ptp(together) > 1e-3  # the pairs are told apart


def test_without_truncation_an_over_long_pair_is_refused(tmp_path):
    from kembed.gateway.errors import PayloadTooLarge

    path = reranker_dir(tmp_path, "qwen3", QWEN3_RERANKER_TEMPLATE, max_length=90)
    with pytest.raises(PayloadTooLarge, match=r"texts\[1\] is more than the model's limit of 90"):
        gateway_pairs(path, QUERY, ["paris", "paris " * 200], truncate=False)


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (
            "{{ messages[0].content | replace(' ', '_') }} {{ messages[1].content }}",
            "changes a pair's content",
        ),
        (
            "{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}",
            "writes more than once the query",
        ),
        ("<|im_start|>user\n{{ messages[0].content }}<|im_end|>", "does not write the document"),
    ],
    ids=["transforms-a-content", "repeats-a-content", "leaves-out-the-document"],
)
def test_a_template_kembed_cannot_cut_into_pieces_is_refused_naming_why(tmp_path, template, reason):
    path = reranker_dir(tmp_path, "qwen3", template) if "replace" in template else None
    if path is None:  # sentence-transformers refuses to build a CrossEncoder on these: write the files
        path = reranker_dir(tmp_path, "qwen3", QWEN3_RERANKER_TEMPLATE)
        (path / "chat_template.jinja").write_text(template)
    with pytest.raises(ValueError, match=reason):
        Tokenization(load_model_spec(path), num_threads=1)


def test_a_reranker_without_an_lm_head_is_refused(tmp_path):
    path = reranker_dir(tmp_path, "qwen3", QWEN3_RERANKER_TEMPLATE)
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("lm_head")}, path / "model.safetensors")
    with pytest.raises(InvalidInput, match=r"no lm_head\.weight and config\.json does not tie it"):
        load_engine(WorkerConfig(model=path, device="cpu"))


def test_a_logit_score_on_another_pipeline_is_refused(tmp_path):
    path = reranker_dir(tmp_path, "qwen3", QWEN3_RERANKER_TEMPLATE)
    sbert = json.loads((path / "sentence_bert_config.json").read_text())
    (path / "sentence_bert_config.json").write_text(
        json.dumps({**sbert, "transformer_task": "feature-extraction"})
    )
    with pytest.raises(
        InvalidInput, match="Transformer with transformer_task text-generation then LogitScore"
    ):
        load_engine(WorkerConfig(model=path, device="cpu"))


def test_an_embedders_chat_template_is_refused_not_read_as_a_pair_template(tmp_path):
    """A directory whose Transformer is no causal LM's (feature-extraction) but takes messages has its
    texts rendered through the chat template by sentence-transformers 6, which the gateway does not
    do for embedders: refused, naming what to change, rather than served with other ids."""
    path = reranker_dir(tmp_path, "qwen3", QWEN3_RERANKER_TEMPLATE)
    sbert = json.loads((path / "sentence_bert_config.json").read_text())
    (path / "sentence_bert_config.json").write_text(
        json.dumps({**sbert, "transformer_task": "feature-extraction"})
    )
    with pytest.raises(ValueError, match="renders every text through the tokenizer's chat template"):
        load_model_spec(path)
    texts_only = {**sbert, "transformer_task": "feature-extraction"}
    texts_only["modality_config"] = {k: v for k, v in sbert["modality_config"].items() if k != "message"}
    (path / "sentence_bert_config.json").write_text(json.dumps(texts_only))
    spec = load_model_spec(path)
    assert spec.chat_template is None
    Tokenization(spec, num_threads=1).close()
