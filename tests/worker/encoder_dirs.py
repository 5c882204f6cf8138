"""Small encoder model directories with random weights, saved as sentence-transformers saves a
`SentenceTransformer(modules=[Transformer, Pooling, Normalize])`, with a word-level tokenizer
(words w0..w199) carrying BERT's special tokens ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4) or
RoBERTa's (<s> 0, <pad> 1, </s> 2, <unk> 3, <mask> 4); and the texts and ids the tests feed them."""

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
