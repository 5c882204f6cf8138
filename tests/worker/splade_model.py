"""A small SPLADE model directory with random weights, built in the tests as sentence-transformers
writes a SparseEncoder (a masked-LM transformer over BertForMaskedLM, then SpladePooling), with a
word-level tokenizer with BERT's special tokens ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4).
`transformer`: "MLMTransformer" (sentence-transformers 5's module, which published SPLADE models
name) or "Transformer" (6's: a Transformer with transformer_task "fill-mask")."""

from pathlib import Path

import torch

WORDS = [f"w{i}" for i in range(120)]


def build_splade_dir(
    path: Path,
    *,
    pooling: str = "max",
    activation: str = "relu",
    seed: int = 0,
    transformer: str = "MLMTransformer",
) -> Path:
    from sentence_transformers import SparseEncoder

    try:
        from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    except ImportError:  # sentence-transformers before 6.2 (a GPU machine's)
        from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=128,
    )  # fmt: skip
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=130,
    )  # fmt: skip
    masked_lm = path.parent / f"{path.name}-mlm"
    BertForMaskedLM(config).eval().save_pretrained(masked_lm)
    fast.save_pretrained(masked_lm)
    if transformer == "Transformer":
        from sentence_transformers.base.modules import Transformer

        module = Transformer(str(masked_lm), transformer_task="fill-mask")
    else:
        module = MLMTransformer(str(masked_lm))
    encoder = SparseEncoder(
        modules=[
            module,
            SpladePooling(pooling_strategy=pooling, activation_function=activation),  # type: ignore[arg-type]
        ],
        device="cpu",
    )
    encoder.save(str(path))
    return path


def splade_reference(path: Path, texts: list[str]) -> list[dict[int, float]]:
    """Each text's sparse vector as sentence-transformers' SparseEncoder.encode gives it."""
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(path), device="cpu")
    rows = encoder.encode(texts, convert_to_tensor=True).to_dense().numpy()
    return [{int(i): float(row[i]) for i in row.nonzero()[0]} for row in rows]
