"""A small BGE-M3-shaped model directory with random weights, built in the tests: an XLM-R encoder,
CLS pooling and Normalize (as BGE-M3's sentence-transformers files say), its `sparse_linear` head
as safetensors and its `colbert_linear` head as the published `.pt` form, and a word-level
tokenizer with XLM-R's special tokens (<s> 0, <pad> 1, </s> 2, <unk> 3)."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

WORDS = [f"w{i}" for i in range(120)]


def build_m3_dir(path: Path, *, hidden: int = 32, seed: int = 0) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(seed)
    path.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    config = XLMRobertaConfig(
        vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=2 * hidden, max_position_embeddings=130, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, type_vocab_size=1,
    )  # fmt: skip
    model = XLMRobertaModel(config, add_pooling_layer=False).eval()
    model.save_pretrained(path, safe_serialization=True)
    save_file(
        {"weight": torch.randn(1, hidden) * 0.5, "bias": torch.tensor([0.1])},
        str(path / "sparse_linear.safetensors"),
    )
    torch.save(
        {"weight": torch.randn(hidden, hidden) * 0.2, "bias": torch.randn(hidden) * 0.1},
        path / "colbert_linear.pt",
    )
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "XLMRobertaTokenizerFast", "model_max_length": 128, "bos_token": "<s>",
        "cls_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "pad_token": "<pad>",
        "unk_token": "<unk>",
    }))  # fmt: skip
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]))  # fmt: skip
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": hidden,
                "pooling_mode_cls_token": True,
                "pooling_mode_mean_tokens": False,
            }
        )
    )
    (path / "2_Normalize").mkdir(exist_ok=True)
    return path


def m3_reference(path: Path, sequences: list[list[int]]) -> list[dict]:
    """BGE-M3's three outputs as FlagEmbedding's BGEM3FlagModel computes them (its M3 model's
    `_dense_embedding` (cls), `_sparse_embedding`, `_colbert_embedding` with normalize_embeddings,
    and the embedder's `_process_token_weights` / `_process_colbert_vecs`), on transformers'
    XLMRobertaModel in float32 over a padded batch. Reimplemented from FlagEmbedding 1.4's source:
    its package imports its training stack (datasets, pyarrow, pandas, accelerate, peft) on import."""
    from transformers import XLMRobertaModel

    model = XLMRobertaModel.from_pretrained(path, add_pooling_layer=False).eval()
    sparse = torch.nn.Linear(model.config.hidden_size, 1)
    sparse.load_state_dict(
        __import__("safetensors.torch").torch.load_file(str(path / "sparse_linear.safetensors"))
    )
    colbert = torch.nn.Linear(model.config.hidden_size, model.config.hidden_size)
    colbert.load_state_dict(torch.load(path / "colbert_linear.pt", weights_only=True))
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), 1)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
    unused = {0, 1, 2, 3}  # cls, pad, eos, unk (special_tokens_map's)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)
        weights = torch.relu(sparse(hidden)).squeeze(-1)
        vecs = colbert(hidden[:, 1:]) * mask[:, 1:][:, :, None].float()
        vecs = torch.nn.functional.normalize(vecs, dim=-1)
    out = []
    for i, seq in enumerate(sequences):
        lexical: dict[int, float] = {}
        for w, idx in zip(weights[i, : len(seq)].tolist(), seq, strict=True):
            if idx not in unused and w > 0 and w > lexical.get(idx, 0):
                lexical[idx] = w
        out.append({
            "dense": dense[i].numpy(), "sparse": lexical, "colbert": vecs[i, : len(seq) - 1].numpy(),
            "tokens": hidden[i, : len(seq)].numpy(),
        })  # fmt: skip
    return out
