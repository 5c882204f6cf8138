"""Writing a sentence-transformers pipeline (modules.json + 1_Pooling) into a test model directory, and
a model of all-MiniLM-L6-v2's shape with random weights."""

import json
from pathlib import Path


def write_pipeline(path: Path, pooling_config: dict, normalize: bool) -> None:
    """Transformer -> Pooling(`pooling_config`) [-> Normalize], as SentenceTransformer.save writes it."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))


def write_random_minilm(path: Path) -> None:
    """all-MiniLM-L6-v2's shape (BERT, 6 layers of 384, mean pooling, normalised, 512 positions) with
    random weights (seed 0) into `path`."""
    import torch  # imported here: the CPU-only tests that use write_pipeline need neither
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512,
    )  # fmt: skip
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(path)
    write_pipeline(path, {"pooling_mode_mean_tokens": True}, normalize=True)
