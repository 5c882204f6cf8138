"""DistilBERT, NomicBERT, GTE and jina-embeddings-v3 on kembed's CPU engine against
`SentenceTransformer(dir).encode` on the same random weights (transformers 5's classes under
sentence-transformers 6): ragged batches of mixed lengths, alone and together; each config spelling
the published models ship; the options each family refuses."""

import json
import re
import shutil

import numpy as np
import pytest
import torch
import transformers
from encoder_dirs import (
    VOCAB_SIZE,
    cosine_rows,
    jina_own_format,
    normalised,
    randomise_norms,
    save_sentence_transformer,
    texts,
    token_ids,
)
from sentence_transformers import SentenceTransformer

from kembed.proto.accuracy import MIN_COSINE
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.errors import InvalidInput
from kembed.worker.tools.check_model import check

# initializer_range 0.2 (not 0.02): attention sharp enough that positions, and so the rotary, show
TINY = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=96, initializer_range=0.2,
)  # fmt: skip
ROPE = {"rope_type": "default", "rope_theta": 100.0}  # short texts rotate far enough at theta 100


def distilbert(**extra):
    config = transformers.DistilBertConfig(
        vocab_size=VOCAB_SIZE, dim=64, n_layers=2, n_heads=4, hidden_dim=96, initializer_range=0.2,
        max_position_embeddings=128, **extra,
    )  # fmt: skip
    return transformers.DistilBertModel(config)


def nomic_bert(**extra):
    config = transformers.NomicBertConfig(**TINY, max_position_embeddings=256, rope_parameters=ROPE, **extra)
    return transformers.NomicBertModel(config)


def gte(type_vocab_size: int, rope=ROPE):
    config = transformers.GteConfig(
        **TINY, max_position_embeddings=256, type_vocab_size=type_vocab_size, rope_parameters=rope
    )
    return transformers.GteModel(config)


def jina_v3():
    config = transformers.JinaEmbeddingsV3Config(**TINY, max_position_embeddings=256, rope_parameters=ROPE)
    return transformers.JinaEmbeddingsV3Model(config)  # with its pooler: saved, never read


# id -> (the transformers model, tokenizer style, pooling), as each family's published pipeline pools
FAMILIES = {
    "distilbert": (lambda: distilbert(), "bert", "mean"),
    "distilbert-sinusoidal": (lambda: distilbert(sinusoidal_pos_embds=True), "bert", "mean"),
    "nomic-bert": (nomic_bert, "bert", "mean"),
    "gte-en-no-token-types": (lambda: gte(0), "bert", "cls"),
    "gte-multilingual": (lambda: gte(1), "roberta", "cls"),
    "jina-embeddings-v3": (jina_v3, "roberta", "mean"),
}


SERVED_AS = {  # what check-model names the family
    "distilbert": "distilbert",
    "distilbert-sinusoidal": "distilbert",
    "nomic-bert": "nomic_bert",
    "gte-en-no-token-types": "gte",
    "gte-multilingual": "gte",
    "jina-embeddings-v3": "jina_embeddings_v3",
}


def build(path, family: str, prompts: dict[str, str] | None = None):
    make, style, pooling = FAMILIES[family]
    torch.manual_seed(0)
    model = make().eval()
    randomise_norms(model)
    return save_sentence_transformer(path, model, style, pooling, prompts=prompts)


def embed(path, sequences: list[str], backend: str = "sdpa", prefix: str = "") -> np.ndarray:
    engine = load_engine(WorkerConfig(model=path, device="cpu", attention_backend=backend))
    ids, lengths = token_ids(path, sequences, prefix)
    return engine.step(engine.pack(ids, lengths)).wait()


def assert_matches(ours: np.ndarray, reference: np.ndarray) -> None:
    assert ours.shape == reference.shape
    assert cosine_rows(ours, reference).min() >= MIN_COSINE
    np.testing.assert_allclose(normalised(ours), reference, atol=1e-4)  # the vectors, not just directions


def rewrite_config(path, **changes) -> None:
    """config.json with `changes` (a value of ... removes its key)."""
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
@pytest.mark.parametrize("family", FAMILIES)
def test_ragged_batch_matches_sentence_transformers_per_row(tmp_path, family, backend):
    path = build(tmp_path / "model", family)
    sequences = texts(1)
    reference = SentenceTransformer(str(path), device="cpu").encode(sequences)
    assert_matches(embed(path, sequences, backend), reference)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_text_alone_gives_its_row_of_the_mixed_batch(tmp_path, family):
    path = build(tmp_path / "model", family)
    sequences = texts(2)
    together = embed(path, sequences)
    alone = np.concatenate([embed(path, [text]) for text in sequences])
    np.testing.assert_allclose(alone, together, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["nomic-bert", "gte-multilingual", "jina-embeddings-v3"])
def test_a_wrong_rotary_theta_shows_on_the_test_texts(tmp_path, family):
    """The comparisons above would catch a wrong rotary: these texts are long enough for it to act."""
    path = build(tmp_path / "model", family)
    sequences = texts(3)
    reference = SentenceTransformer(str(path), device="cpu").encode(sequences)
    rewrite_config(path, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    wrong = embed(path, sequences)
    longer = np.array([len(text.split()) > 2 for text in sequences])
    assert cosine_rows(wrong[longer], reference[longer]).max() < MIN_COSINE


def test_nomic_config_in_nomics_own_spelling_gives_the_same_vectors(tmp_path):
    """nomic-embed-text-v1.5's config.json names its fields as GPT-2 does (n_embd, ...) and its
    rotary as rotary_emb_*; transformers 5's reads hidden_size, rope_parameters, ..."""
    path = build(tmp_path / "model", "nomic-bert")
    sequences = texts(4)
    reference = SentenceTransformer(str(path), device="cpu").encode(sequences)
    native = json.loads((path / "config.json").read_text())
    nomic_own = {
        "model_type": "nomic_bert", "architectures": ["NomicBertModel"],
        "auto_map": {"AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"},
        "activation_function": "swiglu", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_inner": 96,
        "n_positions": 256, "vocab_size": VOCAB_SIZE, "type_vocab_size": 2,
        "layer_norm_epsilon": native["layer_norm_eps"], "rotary_emb_base": 100.0,
        "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_scaling_factor": None,
        "rotary_emb_scale_base": None, "qkv_proj_bias": False, "mlp_fc1_bias": False,
        "mlp_fc2_bias": False, "prenorm": False, "parallel_block": False, "use_rms_norm": False,
        "causal": False,
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(nomic_own))
    assert_matches(embed(path, sequences), reference)
    assert check(path).max_positions == 256


def test_gte_fixed_ntk_scaling_is_transformers_linear_scaling_of_theta_times_the_factor(tmp_path):
    """Alibaba's NewModel (model_type new) scales its rotary by fixed NTK, `rope_scaling: {type: ntk,
    factor: f}`: theta f * theta and frequencies / f^(2/d), at every position. transformers' linear
    scaling of that theta by f^(2/d) computes the same, so it is the reference here."""
    factor, theta, head_dim = 2.0, 100.0, 16
    linear = {"rope_type": "linear", "rope_theta": theta * factor, "factor": factor ** (2 / head_dim)}
    torch.manual_seed(0)
    model = gte(1, rope=linear).eval()
    randomise_norms(model)
    path = save_sentence_transformer(tmp_path / "model", model, "roberta", "cls")
    sequences = texts(5)
    reference = SentenceTransformer(str(path), device="cpu").encode(sequences)
    rewrite_config(
        path, model_type="new", architectures=["NewModel"], rope_parameters=..., rope_theta=theta,
        rope_scaling={"type": "ntk", "factor": factor}, position_embedding_type="rope",
        layer_norm_type="layer_norm", logn_attention_scale=False, pack_qkv=True, unpad_inputs=True,
    )  # fmt: skip
    assert_matches(embed(path, sequences), reference)
    rewrite_config(path, rope_scaling=None)  # and the scaling acts on these texts
    unscaled = embed(path, sequences)
    assert cosine_rows(unscaled[1:], reference[1:]).min() < MIN_COSINE


def test_nomic_prompts_reach_the_tokens_as_sentence_transformers_prepends_them(tmp_path):
    prompts = {"search_query": "search_query: ", "search_document": "search_document: "}
    path = build(tmp_path / "model", "nomic-bert", prompts=prompts)
    assert check(path).prompts.items() >= prompts.items()  # (sentence-transformers adds query, document)
    sequences = texts(6)
    model = SentenceTransformer(str(path), device="cpu")
    for name, prefix in prompts.items():
        assert_matches(embed(path, sequences, prefix=prefix), model.encode(sequences, prompt_name=name))


REFUSED = {
    "nomic-prenorm": ("nomic-bert", {"prenorm": True}, "prenorm=True"),
    "nomic-moe": ("nomic-bert", {"moe_every_n_layers": 2, "num_experts": 8}, "moe_every_n_layers=2"),
    "nomic-dynamic-rotary": ("nomic-bert", {"rotary_scaling_factor": 2.0}, "rotary_scaling_factor=2.0"),
    "gte-rms-norm": ("gte-multilingual", {"layer_norm_type": "rms_norm"}, "layer_norm_type='rms_norm'"),
    "gte-logn": ("gte-multilingual", {"logn_attention_scale": True}, "logn_attention_scale=True"),
    "gte-mixed-ntk": (
        "gte-multilingual",
        {"rope_parameters": None, "rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}},
        "'mixed_b': 0.5",
    ),
    "jina-yarn": ("jina-embeddings-v3", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    "distilbert-classifier": (
        "distilbert",
        {"architectures": ["DistilBertForSequenceClassification"]},
        "not its sequence-classification",
    ),
    "jina-adapter-not-its-own": (
        "jina-embeddings-v3",
        {},
        "adapter 'retrieval.query' is not one of this model's: it has no task adapters",
    ),
    "adapter-on-a-family-without": ("nomic-bert", {}, "a nomic_bert model has no task adapters"),
}


@pytest.mark.parametrize(("family", "changes", "reason"), REFUSED.values(), ids=REFUSED.keys())
def test_an_option_not_served_is_refused_at_start_naming_it(tmp_path, family, changes, reason):
    path = build(tmp_path / "model", family)
    rewrite_config(path, **{k: ... if v is None else v for k, v in changes.items()})
    adapter = "retrieval.query" if "adapter" in reason else ""
    with pytest.raises(InvalidInput) as raised:
        load_engine(WorkerConfig(model=path, device="cpu", adapter=adapter))
    assert reason in str(raised.value)
    if not adapter:  # check-model says what the worker says
        assert check(path).reason == str(raised.value)


@pytest.mark.parametrize("family", FAMILIES)
def test_check_model_names_the_family_and_what_is_served(tmp_path, family):
    path = build(tmp_path / "model", family)
    result = check(path, load=True)
    assert result.is_servable, result.reason
    assert result.family == SERVED_AS[family]
    assert result.pooling == FAMILIES[family][2] and result.dimensions == 64 and result.loaded


TASKS = ["retrieval.query", "retrieval.passage", "text-matching"]


@pytest.fixture(scope="module")
def jina_dirs(tmp_path_factory):
    """(transformers' format, Jina's own with adapters, per task the reference's vectors)."""
    from safetensors.torch import save_file

    base = tmp_path_factory.mktemp("jina")
    native = build(base / "native", "jina-embeddings-v3")
    merged = jina_own_format(native, base / "own", TASKS, theta=ROPE["rope_theta"])
    sequences = texts(8)
    references = {"": SentenceTransformer(str(native), device="cpu").encode(sequences)}
    for task, state in merged.items():  # the reference: transformers' class on the merged weights
        task_dir = base / f"merged-{task}"
        shutil.copytree(native, task_dir)
        save_file(state, task_dir / "model.safetensors")
        references[task] = SentenceTransformer(str(task_dir), device="cpu").encode(sequences)
    return native, base / "own", sequences, references


@pytest.mark.parametrize("adapter", ["", *TASKS], ids=["no-adapter", *TASKS])
def test_jina_own_checkpoint_serves_the_deployments_task_adapter(jina_dirs, adapter):
    _, own, sequences, references = jina_dirs
    engine = load_engine(WorkerConfig(model=own, device="cpu", adapter=adapter))
    ids, lengths = token_ids(own, sequences)
    assert_matches(engine.step(engine.pack(ids, lengths)).wait(), references[adapter])


def test_jina_adapters_act_on_the_test_texts_and_check_model_names_them(jina_dirs):
    _, own, _, references = jina_dirs
    for task in TASKS:
        assert cosine_rows(references[task], references[""]).max() < MIN_COSINE
    result = check(own, load=True)
    assert result.is_servable and result.family == "jina_embeddings_v3"
    assert result.adapters == TASKS
    with pytest.raises(
        InvalidInput, match=re.escape("its tasks are retrieval.query, retrieval.passage, text-matching")
    ):
        load_engine(WorkerConfig(model=own, device="cpu", adapter="classification"))
