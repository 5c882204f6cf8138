"""Writing a sentence-transformers pipeline (modules.json + 1_Pooling) into a test model directory."""

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
