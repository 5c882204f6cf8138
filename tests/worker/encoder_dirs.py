"""Small encoder model directories with random weights, saved as sentence-transformers saves a
`SentenceTransformer(modules=[Transformer, Pooling, Normalize])`, with a word-level tokenizer
(words w0..w199) carrying BERT's special tokens ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4) or
RoBERTa's (<s> 0, <pad> 1, </s> 2, <unk> 3, <mask> 4); and the texts and ids the tests feed them."""

import json
import shutil
from pathlib import Path

import numpy as np
import torch

WORDS = [f"w{i}" for i in range(200)]
SPECIALS = {
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
}
VOCAB_SIZE = len(WORDS) + 5
# words per text: one word, a length repeated, and past 64 tokens (more than one padded tile)
TEXT_LENGTHS = (1, 6, 31, 2, 70, 12, 12, 4)


def word_tokenizer(style: str, max_length: int = 512):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = SPECIALS[style]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    if style == "bert":
        pad, unk, cls, sep, mask = specials
        post = processors.BertProcessing((sep, vocab[sep]), (cls, vocab[cls]))
    else:
        cls, pad, sep, unk, mask = specials
        post = processors.RobertaProcessing((sep, vocab[sep]), (cls, vocab[cls]))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = post
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token=unk, pad_token=pad, cls_token=cls, sep_token=sep,
        mask_token=mask, model_max_length=max_length,
    )  # fmt: skip


def randomise_norms(model: torch.nn.Module) -> None:
    """LayerNorm weights and biases away from one and zero, so a misplaced norm shows."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower() or "_ln" in name:
                if name.endswith("weight"):
                    param.uniform_(0.5, 1.5)
                else:
                    param.uniform_(-0.2, 0.2)


def save_sentence_transformer(
    path: Path,
    model,  # a transformers PreTrainedModel
    style: str,
    pooling: str,
    *,
    prompts: dict[str, str] | None = None,
) -> Path:
    """`model` with a word-level tokenizer as a sentence-transformers directory at `path`:
    Transformer, Pooling(`pooling`), Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    hf_dir = path.parent / f"{path.name}-hf"
    model.save_pretrained(hf_dir)
    word_tokenizer(style).save_pretrained(hf_dir)
    transformer = Transformer(str(hf_dir), max_seq_length=256)
    pool = Pooling(model.config.hidden_size, pooling_mode=pooling)
    st = SentenceTransformer(modules=[transformer, pool, Normalize()], prompts=prompts, device="cpu")
    st.save(str(path))
    return path


def texts(seed: int, lengths: tuple[int, ...] = TEXT_LENGTHS) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, n)) for n in lengths]


def token_ids(path: Path, texts: list[str], prefix: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(packed ids, lengths) of `texts` as the gateway tokenizes them: tokenizer.json, the prompt
    prepended to the text."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    ids = [np.asarray(tokenizer.encode(prefix + text).ids, np.int32) for text in texts]
    return np.concatenate(ids), np.array([len(i) for i in ids], np.int32)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def normalised(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


_LORA_LINEARS = ("Wqkv", "out_proj", "fc1", "fc2", "dense")  # jina's flash implementation's linears


def jina_own_format(
    native_dir: Path, target_dir: Path, tasks: list[str], theta: float, seed: int = 7
) -> dict[str, dict[str, torch.Tensor]]:
    """`native_dir` (transformers' JinaEmbeddingsV3Model format) rewritten into `target_dir` as Jina's
    own checkpoint (XLMRobertaLoRA: every linear and embedding a parametrization with random
    per-task LoRA factors, "roberta."-prefixed, config.json as Jina writes it). Returns, per task,
    the native state dict with that task merged, as Jina's LoRAParametrization.lora_forward merges it."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(native_dir, target_dir)
    weights = load_file(native_dir / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    rank, alpha = 4, 1.0
    own: dict[str, torch.Tensor] = {}
    merged: dict[str, dict[str, torch.Tensor]] = {task: dict(weights) for task in tasks}
    for key, tensor in weights.items():
        module = key.removesuffix(".weight")
        is_embedding = module.startswith("embeddings.")
        if not key.endswith(".weight") or not (is_embedding or module.split(".")[-1] in _LORA_LINEARS):
            own[f"roberta.{key}"] = tensor
            continue
        rows, cols = tensor.shape
        shapes = ((rows, rank), (rank, cols)) if is_embedding else ((rank, cols), (rows, rank))
        lora_a = torch.randn(len(tasks), *shapes[0], generator=generator) * 0.3
        lora_b = torch.randn(len(tasks), *shapes[1], generator=generator) * 0.3
        own[f"roberta.{module}.parametrizations.weight.original"] = tensor
        own[f"roberta.{module}.parametrizations.weight.0.lora_A"] = lora_a
        own[f"roberta.{module}.parametrizations.weight.0.lora_B"] = lora_b
        for t, task in enumerate(tasks):  # lora_forward: X + matmul(*swap((B[t], A[t]))).view(X.shape) * s
            pair = (lora_a[t], lora_b[t]) if is_embedding else (lora_b[t], lora_a[t])
            merged[task][key] = tensor + torch.matmul(*pair).view(tensor.shape) * (alpha / rank)
    (target_dir / "model.safetensors").unlink()
    save_file(own, target_dir / "model.safetensors")
    config = json.loads((native_dir / "config.json").read_text())
    config = {k: v for k, v in config.items() if k != "rope_parameters"}
    config |= {
        "model_type": "xlm-roberta", "architectures": ["XLMRobertaLoRA"],
        "auto_map": {"AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora.XLMRobertaLoRA"},
        "position_embedding_type": "rotary", "rotary_emb_base": theta,
        "lora_adaptations": tasks, "lora_rank": rank, "lora_alpha": alpha, "lora_dropout_p": 0.0,
        "task_instructions": {task: "" for task in tasks}, "load_trained_adapters": True,
    }  # fmt: skip
    (target_dir / "config.json").write_text(json.dumps(config))
    return merged
