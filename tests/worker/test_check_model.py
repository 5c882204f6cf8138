"""`kembed-worker check-model`: every row of docs/your-model.md's compatibility table is a case here
(read from the doc, so the two cannot drift), checked on a directory of the row's family and
sentence-transformers files with tiny random weights, or the bundled model as it is; servable rows
are also built by the engine on the CPU. A refusal is the worker's own: loading the directory fails
with the same reason."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers
from bias_models import write_deberta_reranker, write_mpnet, write_sentence_t5
from encoder_dirs import jina_own_format
from st_pipeline import write_pipeline

from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.engine import load_engine
from kembed.worker.errors import InvalidInput
from kembed.worker.tools.check_model import check, render

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "your-model.md"
BENCH_CONFIGS = REPO / "tests" / "bench" / "configs"
BUNDLED = bundled_model_dir()
# Small enough to build in a blink; the bundled tokenizer's vocabulary, so --load can embed a text.
TINY = dict(
    vocab_size=30522,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=130,
)
QWEN3_QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)


def table_rows() -> dict[str, tuple[str, str]]:
    """The compatibility table: first cell -> (config.json cell, check-model cell)."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("model", "---"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def with_tokenizer(path: Path) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(BUNDLED / name, path / name)
    return path


def save(model: transformers.PreTrainedModel, path: Path) -> None:
    model.save_pretrained(path)  # safetensors, as hub models ship


def pooling_config(mode: str) -> dict:
    return {"word_embedding_dimension": TINY["hidden_size"], "pooling_mode": mode}


def bert_embedder(pooling: str) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        save(transformers.BertModel(transformers.BertConfig(**TINY), add_pooling_layer=False), path)
        write_pipeline(path, pooling_config(pooling), normalize=True)
        return with_tokenizer(path)

    return build


def xlm_roberta_embedder(pooling: str) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        config = transformers.XLMRobertaConfig(**TINY)
        save(transformers.XLMRobertaModel(config, add_pooling_layer=False), path)
        write_pipeline(path, pooling_config(pooling), normalize=True)
        return with_tokenizer(path)

    return build


def bge_m3(path: Path) -> Path:
    """BAAI/bge-m3's config.json and sentence-transformers files, its sizes shrunk."""
    real = json.loads((BENCH_CONFIGS / "bge-m3" / "config.json").read_text())
    real = {k: v for k, v in real.items() if k != "_comment"}
    config = transformers.XLMRobertaConfig(**{**real, **TINY})
    save(transformers.XLMRobertaModel(config, add_pooling_layer=False), path)
    shutil.copy(BENCH_CONFIGS / "bge-m3" / "modules.json", path)
    shutil.copytree(BENCH_CONFIGS / "bge-m3" / "1_Pooling", path / "1_Pooling")
    return with_tokenizer(path)


def qwen3_embedding(path: Path) -> Path:
    """Qwen3-Embedding's architecture, sentence-transformers files and query prompt, sizes shrunk."""
    config = transformers.Qwen3Config(
        **{**TINY, "num_key_value_heads": 1, "head_dim": 16}, tie_word_embeddings=True
    )
    save(transformers.Qwen3Model(config), path)
    shutil.copy(BENCH_CONFIGS / "qwen3-0.6b" / "modules.json", path)
    shutil.copytree(BENCH_CONFIGS / "qwen3-0.6b" / "1_Pooling", path / "1_Pooling")
    prompts = {"prompts": {"query": QWEN3_QUERY_PROMPT, "document": ""}, "default_prompt_name": None}
    (path / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    return with_tokenizer(path)


def encoder_embedder(
    model: Callable[[], transformers.PreTrainedModel],
    pooling: str,
    config_json: Callable[[dict], dict] | None = None,
) -> Callable[[Path], Path]:
    """`model()` saved with a sentence-transformers pipeline; `config_json` rewrites its config.json
    as the published checkpoint spells it."""

    def build(path: Path) -> Path:
        save(model(), path)
        if config_json is not None:
            config = json.loads((path / "config.json").read_text())
            (path / "config.json").write_text(json.dumps(config_json(config)))
        write_pipeline(path, pooling_config(pooling), normalize=True)
        return with_tokenizer(path)

    return build


BERT_TOKENS = dict(pad_token_id=0, bos_token_id=101, eos_token_id=102)  # the bundled tokenizer's


def modernbert(pooling: str | None, scorer: bool = False) -> Callable[[Path], Path]:
    """A ModernBERT embedder (local layers every other one) or its reranker head."""

    def build(path: Path) -> Path:
        config = transformers.ModernBertConfig(
            **TINY, **BERT_TOKENS, cls_token_id=101, sep_token_id=102, local_attention=16,
            num_labels=1,
        )  # fmt: skip
        if scorer:
            save(transformers.ModernBertForSequenceClassification(config), path)
        else:
            save(transformers.ModernBertModel(config), path)
            write_pipeline(path, pooling_config(pooling or "mean"), normalize=True)
        return with_tokenizer(path)

    return build


def nomic_own_spelling(config: dict) -> dict:
    """nomic-embed-text-v1.5's config.json: GPT-2's field names, rotary_emb_*, its custom code."""
    return {
        **custom_code("nomic_bert", "NomicBert"), "activation_function": "swiglu",
        "n_embd": config["hidden_size"], "n_head": config["num_attention_heads"],
        "n_layer": config["num_hidden_layers"], "n_inner": config["intermediate_size"],
        "n_positions": 8192, "vocab_size": config["vocab_size"], "type_vocab_size": 2,
        "layer_norm_epsilon": 1e-12, "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False, "rotary_scaling_factor": None, "qkv_proj_bias": False,
        "mlp_fc1_bias": False, "mlp_fc2_bias": False, "prenorm": False, "causal": False,
    }  # fmt: skip


def gte_new_spelling(config: dict) -> dict:
    """gte-base-en-v1.5's config.json: model_type new, fixed NTK rotary scaling, its custom code."""
    config = {k: v for k, v in config.items() if k != "rope_parameters"}
    return {
        **config, **custom_code("new", "New"), "position_embedding_type": "rope", "rope_theta": 500000,
        "rope_scaling": {"type": "ntk", "factor": 2.0}, "layer_norm_type": "layer_norm",
        "logn_attention_scale": False, "type_vocab_size": 0, "pack_qkv": True, "unpad_inputs": True,
    }  # fmt: skip


def jina_v3_own_format(path: Path) -> Path:
    """jina-embeddings-v3 as Jina publishes it: XLMRobertaLoRA's config.json and parametrized weights
    with task LoRA factors (random), its sentence-transformers pipeline."""
    native = path / "native"
    native.mkdir()
    encoder_embedder(
        lambda: transformers.JinaEmbeddingsV3Model(transformers.JinaEmbeddingsV3Config(**TINY)), "mean"
    )(native)
    jina_own_format(native, path / "model", ["retrieval.query", "retrieval.passage"], theta=20000.0)
    return path / "model"


def embeddinggemma(path: Path) -> Path:
    """EmbeddingGemma's architecture and pipeline (mean pooling, two Dense layers, Normalize)."""
    from sentence_transformers.base.modules import Dense

    config = transformers.Gemma3TextConfig(
        **TINY, **BERT_TOKENS, num_key_value_heads=1, head_dim=16, sliding_window=16,
        use_bidirectional_attention=True,
    )  # fmt: skip
    save(transformers.Gemma3TextModel(config), path)
    write_pipeline(path, pooling_config("mean"), normalize=True)
    modules = json.loads((path / "modules.json").read_text())
    for at, (folder, sizes) in enumerate((("2_Dense", (32, 128)), ("3_Dense", (128, 32))), start=2):
        (path / folder).mkdir()
        Dense(*sizes, bias=False, activation_function=torch.nn.Identity()).save(str(path / folder))
        kind = "sentence_transformers.models.Dense"
        modules.insert(at, {"idx": at, "name": str(at), "path": folder, "type": kind})
    (path / "modules.json").write_text(json.dumps(modules))
    return with_tokenizer(path)


def e5_mistral(path: Path) -> Path:
    config = transformers.MistralConfig(**TINY, **BERT_TOKENS, num_key_value_heads=1, sliding_window=16)
    save(transformers.MistralModel(config), path)
    write_pipeline(path, pooling_config("lasttoken"), normalize=True)
    return with_tokenizer(path)


def with_auto_map(path: Path, module: str) -> None:
    """The `auto_map` the hub checkpoint carries (its own modeling code, which kembed never runs)."""
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoModel": f"{module}.Model"}
    (path / "config.json").write_text(json.dumps(config))


def qwen2_embedder(pooling: str, dense: bool = False) -> Callable[[Path], Path]:
    """gte-Qwen2's shape (last token, normalised) or stella's (mean, a Dense module), sizes shrunk."""

    def build(path: Path) -> Path:
        save(transformers.Qwen2Model(transformers.Qwen2Config(**{**TINY, "num_key_value_heads": 1})), path)
        with_auto_map(path, "modeling_qwen")
        write_pipeline(path, pooling_config(pooling), normalize=not dense)
        if dense:
            modules = json.loads((path / "modules.json").read_text())
            modules.append(
                {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
            )
            (path / "modules.json").write_text(json.dumps(modules))
            (path / "2_Dense").mkdir()
            dense_config = {"in_features": 32, "out_features": 16, "bias": True,
                            "activation_function": "torch.nn.modules.linear.Identity"}  # fmt: skip
            (path / "2_Dense" / "config.json").write_text(json.dumps(dense_config))
            torch.save({"linear.weight": torch.randn(16, 32), "linear.bias": torch.zeros(16)},
                       path / "2_Dense" / "pytorch_model.bin")  # fmt: skip
        return with_tokenizer(path)

    return build


def eurobert(path: Path) -> Path:
    """EuroBERT as its hub checkpoints ship (no sentence-transformers pipeline), sizes shrunk."""
    ids = dict(pad_token_id=0, bos_token_id=101, eos_token_id=102, mask_token_id=103)
    save(transformers.EuroBertModel(transformers.EuroBertConfig(**TINY, **ids)), path)
    with_auto_map(path, "modeling_eurobert")
    return with_tokenizer(path)


def llm_reranker(config_cls: type, model_cls: type) -> Callable[[Path], Path]:
    """Qwen3-Reranker's (or mxbai-rerank-v2's) shape as sentence-transformers 6 saves it: the causal
    LM, chat_template.jinja, modules.json with LogitScore ("yes", "no"), sizes shrunk."""

    def build(path: Path) -> Path:
        from decoder_dirs import QWEN3_RERANKER_TEMPLATE
        from sentence_transformers import CrossEncoder

        raw = path / "raw"
        raw.mkdir()
        shape = {**TINY, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 512}
        config = config_cls(**shape, tie_word_embeddings=True)
        save(model_cls(config), raw)
        with_tokenizer(raw)
        (raw / "chat_template.jinja").write_text(QWEN3_RERANKER_TEMPLATE)
        CrossEncoder(str(raw), device="cpu").save(str(path / "model"))
        shutil.rmtree(raw)
        return path / "model"

    return build


def chat_rendered_embedder(path: Path) -> Path:
    """An embedder as sentence-transformers 6 saves one whose tokenizer has a chat template: its
    sentence_bert_config.json's modality_config takes messages, and it renders texts through it."""
    from decoder_dirs import bpe_tokenizer, save_decoder
    from sentence_transformers import SentenceTransformer

    raw = path / "raw"
    raw.mkdir()
    save_decoder(raw, "qwen2")
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    bpe_tokenizer(chat_template=template).save_pretrained(raw)
    SentenceTransformer(str(raw), device="cpu").save(str(path / "model"))
    shutil.rmtree(raw)
    return path / "model"


def cross_encoder(config_cls: type, model_cls: type) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        save(model_cls(config_cls(**TINY, num_labels=1)), path)
        return with_tokenizer(path)

    return build


def config_only(config: dict) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        (path / "config.json").write_text(json.dumps(config))
        return with_tokenizer(path)

    return build


def pickled_bert(path: Path) -> Path:
    """A checkpoint as older hub models ship it: config.json and a pickled pytorch_model.bin."""
    model = transformers.BertModel(transformers.BertConfig(**TINY), add_pooling_layer=False)
    model.config.save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")
    return with_tokenizer(path)


def bert_without_tokenizer(path: Path) -> Path:
    save(transformers.BertModel(transformers.BertConfig(**TINY), add_pooling_layer=False), path)
    shutil.copy(BUNDLED / "vocab.txt", path / "vocab.txt")
    return path


def custom_code(model_type: str, module: str) -> dict:
    return {
        "model_type": model_type,
        "architectures": [f"{module}Model"],
        "auto_map": {"AutoConfig": f"{module}.Config", "AutoModel": f"{module}.Model"},
    }


@dataclass(frozen=True)
class Case:
    build: Callable[[Path], Path]
    refusal: str | None = None  # a piece of the reason, for a row that is not servable


CASES = {
    "`sentence-transformers/all-MiniLM-L6-v2` (bundled)": Case(lambda _: BUNDLED),
    "`BAAI/bge-{small,base,large}-en-v1.5`": Case(bert_embedder("cls")),
    "`BAAI/bge-m3`": Case(bge_m3),
    "`intfloat/e5-base-v2`": Case(bert_embedder("mean")),
    "`intfloat/multilingual-e5-large`": Case(xlm_roberta_embedder("mean")),
    "`Qwen/Qwen3-Embedding-0.6B`, `-4B`, `-8B`": Case(qwen3_embedding),
    "`Alibaba-NLP/gte-Qwen2-1.5B-instruct`, `-7B-instruct`": Case(qwen2_embedder("lasttoken")),
    "`NovaSearch/stella_en_1.5B_v5`": Case(qwen2_embedder("mean", dense=True)),
    "`EuroBERT/EuroBERT-210m`, `-610m`, `-2.1B`": Case(eurobert),
    "`BAAI/bge-reranker-v2-m3`, `bge-reranker-{base,large}`": Case(
        cross_encoder(transformers.XLMRobertaConfig, transformers.XLMRobertaForSequenceClassification)
    ),
    "`Qwen/Qwen3-Reranker-0.6B`, `-4B`, `-8B`, saved as a CrossEncoder": Case(
        llm_reranker(transformers.Qwen3Config, transformers.Qwen3ForCausalLM)
    ),
    "`mixedbread-ai/mxbai-rerank-base-v2`, `-large-v2`, saved as a CrossEncoder": Case(
        llm_reranker(transformers.Qwen2Config, transformers.Qwen2ForCausalLM)
    ),
    "`cross-encoder/ms-marco-MiniLM-L-6-v2`": Case(
        cross_encoder(transformers.BertConfig, transformers.BertForSequenceClassification)
    ),
    "`sentence-transformers/multi-qa-distilbert-cos-v1`": Case(
        encoder_embedder(
            lambda: transformers.DistilBertModel(
                transformers.DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
            ),
            "mean",
        )
    ),
    "`nomic-ai/nomic-embed-text-v1`, `-v1.5`": Case(
        encoder_embedder(
            lambda: transformers.NomicBertModel(transformers.NomicBertConfig(**TINY)),
            "mean",
            nomic_own_spelling,
        )
    ),
    "`sentence-transformers/all-mpnet-base-v2`, `multi-qa-mpnet-base-cos-v1`": Case(
        lambda path: write_mpnet(path / "mpnet")
    ),
    "`sentence-transformers/sentence-t5-{base,large}`, `gtr-t5-{base,large}`": Case(
        lambda path: write_sentence_t5(path / "sentence-t5", "relu")
    ),
    "`mixedbread-ai/mxbai-rerank-{xsmall,base,large}-v1`": Case(
        lambda path: write_deberta_reranker(path / "mxbai-rerank", "v3")
    ),
    "`Alibaba-NLP/gte-base-en-v1.5`, `gte-multilingual-base`": Case(
        encoder_embedder(
            lambda: transformers.GteModel(transformers.GteConfig(**TINY, type_vocab_size=0)),
            "cls",
            gte_new_spelling,
        )
    ),
    "`jinaai/jina-embeddings-v3` in transformers' format": Case(
        encoder_embedder(
            lambda: transformers.JinaEmbeddingsV3Model(transformers.JinaEmbeddingsV3Config(**TINY)), "mean"
        )
    ),
    "`jinaai/jina-embeddings-v3` (Jina's own format, task LoRA adapters)": Case(jina_v3_own_format),
    "`jinaai/jina-embeddings-v2-base-en`": Case(
        config_only(
            {
                **transformers.BertConfig(**TINY).to_dict(),
                **custom_code("bert", "JinaBert"),
                "position_embedding_type": "alibi",
            }
        ),
        "only absolute position embeddings",
    ),
    "`Alibaba-NLP/gte-modernbert-base`": Case(modernbert("cls")),
    "`nomic-ai/modernbert-embed-base`": Case(modernbert("mean")),
    "`Alibaba-NLP/gte-reranker-modernbert-base`": Case(modernbert(None, scorer=True)),
    "`google/embeddinggemma-300m`": Case(embeddinggemma),
    "`intfloat/e5-mistral-7b-instruct`, `Salesforce/SFR-Embedding-Mistral`": Case(e5_mistral),
    "any model with only `pytorch_model.bin`": Case(pickled_bert, "only pickled ones (pytorch_model.bin)"),
    "any model without `tokenizer.json`": Case(bert_without_tokenizer, "no tokenizer.json"),
    "an embedder sentence-transformers 6 saved with a tokenizer chat template": Case(
        chat_rendered_embedder, "renders every text through the tokenizer's chat template"
    ),
}
ROWS = table_rows()


def test_every_table_row_has_a_case_and_every_case_a_row():
    assert set(ROWS) == set(CASES)


@pytest.mark.parametrize("row", CASES, ids=lambda row: re.sub(r"[^\w.-]+", "-", row).strip("-"))
def test_the_table_row_is_what_check_model_says(tmp_path, row):
    config_cell, expected = ROWS[row]
    case = CASES[row]
    path = case.build(tmp_path)
    result = check(path, load=case.refusal is None)
    if case.refusal is None:
        assert result.verdict == expected, result.reason
        assert result.loaded, "servable rows are built on the CPU and run one input"
        assert result.routes and ("POST /rerank" in result.routes) == (result.task == "score")
    else:
        assert expected.startswith("not servable: ")
        assert not result.is_servable and case.refusal in result.reason, result.reason
    model_type = re.match(r"`([\w-]+)`", config_cell)
    if model_type:  # the config.json column names the model_type the directory has
        assert result.model_type == model_type.group(1)


def test_qwen3_embedding_prompts_come_from_its_sentence_transformers_config(tmp_path):
    result = check(qwen3_embedding(tmp_path))
    assert result.prompts == {"query": QWEN3_QUERY_PROMPT, "document": ""}
    assert (result.pooling, result.pooling_source, result.dimensions) == ("last", "modules.json", 32)


def test_an_llm_reranker_says_its_score_and_pair_template(tmp_path):
    result = check(llm_reranker(transformers.Qwen3Config, transformers.Qwen3ForCausalLM)(tmp_path), load=True)
    assert (result.family, result.task, result.attention) == ("llm-reranker", "score", "causal")
    assert result.score.startswith("logit('yes') - logit('no') at the last token")
    assert result.pair_template.startswith("chat_template.jinja: '<|im_start|>system\\nJudge whether")
    assert "<Query>: {query}\\n<Document>: {document}<|im_end|>" in result.pair_template
    assert "one input" in result.loaded and "score of 1" in result.loaded


def test_a_bare_causal_lm_is_an_embedder_and_check_model_says_how_to_serve_it_as_a_reranker(tmp_path):
    config = transformers.Qwen3Config(**{**TINY, "num_key_value_heads": 1, "head_dim": 16})
    save(transformers.Qwen3ForCausalLM(config), tmp_path)
    result = check(with_tokenizer(tmp_path))
    assert (result.task, result.pooling) == ("embed", "last")
    assert any("saved it as a CrossEncoder" in note for note in result.notes)


def test_a_bare_qwen3_directory_gets_the_family_default_pooling(tmp_path):
    qwen3_embedding(tmp_path)
    (tmp_path / "modules.json").unlink()
    result = check(tmp_path)
    assert (result.pooling, result.normalize) == ("last", False)
    assert result.pooling_source == "no modules.json: the qwen3 default"


@pytest.mark.parametrize(
    "row", [row for row, case in CASES.items() if case.refusal and "tokenizer" not in case.refusal]
)
def test_a_refusal_is_the_workers_own(tmp_path, row):
    """check-model says what loading the directory in a worker says: the same rule, not a copy."""
    path = CASES[row].build(tmp_path)
    with pytest.raises(InvalidInput) as raised:
        load_engine(WorkerConfig(model=path, device="cpu"))
    assert check(path).reason == str(raised.value)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "kembed.worker", "check-model", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_exits_zero_for_a_servable_directory_and_prints_json():
    done = run_cli(str(BUNDLED), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "servable: embeddings, mean pooling, normalised"
    assert (report["task"], report["dimensions"], report["max_seq_length"]) == ("embed", 384, 256)


def test_cli_exits_one_with_the_reason_when_not_servable(tmp_path):
    pickled_bert(tmp_path)
    done = run_cli(str(tmp_path))
    assert done.returncode == 1
    assert "verdict" in done.stdout and "pytorch_model.bin" in done.stdout
    missing = run_cli(str(tmp_path / "nowhere"))
    assert missing.returncode == 1 and "is not a directory" in missing.stdout


@pytest.mark.parametrize(
    ("build", "attention"),
    [
        (
            lambda path: write_mpnet(path / "mpnet"),
            "a distance position bias: on a GPU triton in CUDA graphs",
        ),
        (
            lambda path: write_deberta_reranker(path / "deberta", "v3"),
            "a disentangled position bias: on a GPU triton in CUDA graphs",
        ),
    ],
    ids=["mpnet", "deberta"],
)
def test_check_model_says_how_a_position_bias_runs_on_a_gpu(tmp_path, build, attention):
    result = check(build(tmp_path))
    assert result.is_servable and result.attention.startswith(attention), result.attention
    assert result.attention.endswith(
        "(where installed), else sdpa-padded in the eager engine (no CUDA graphs)"
    )
    assert re.search(rf"^attention +{re.escape(result.attention)}$", render(result), re.MULTILINE)


def test_check_model_says_a_head_size_the_kernel_lacks_runs_eagerly(tmp_path):
    path = write_mpnet(tmp_path / "mpnet")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4}))  # heads of 16
    assert check(path).attention == (
        "a distance position bias, which no varlen kernel adds at head size 16: on a GPU sdpa-padded "
        "in the eager engine (no CUDA graphs)"
    )


def test_check_model_names_the_sentence_t5_dense_layer(tmp_path):
    result = check(write_sentence_t5(tmp_path / "t5", "gated-gelu"))
    assert (result.family, result.dimensions, result.normalize) == ("t5", 48, True)
    assert result.dense == ["2_Dense: 64 -> 48, Identity"]


def test_cli_without_a_directory_is_a_usage_error():
    done = run_cli()
    assert done.returncode == 2 and "usage: kembed-worker check-model" in done.stderr


def test_a_decoders_attention_and_its_unrun_custom_code_are_named(tmp_path):
    qwen2_embedder("lasttoken")(tmp_path)
    assert check(tmp_path).attention == "causal"
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "is_causal": False}))
    result = check(tmp_path)
    assert result.attention == "bidirectional (config.json is_causal: False)"
    assert "modeling_qwen.Model" in result.custom_code
    (tmp_path / "eurobert").mkdir()
    assert check(eurobert(tmp_path / "eurobert")).attention == "bidirectional (the family is an encoder)"
