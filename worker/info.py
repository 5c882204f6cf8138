"""What a loaded model is, as the server reports it: a plain record, free of torch and gRPC."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the served model and the engine's resolved choices (see `proto` InfoResponse)."""

    model_name: str
    model_type: str  # config.json model_type, e.g. "bert"
    task: str  # "embed" or "score"
    dimensions: int  # pooled vector size
    max_sequence_length: int  # longest sequence the position table allows, in tokens
    vocab_size: int  # ids must be < this
    pooling: str  # "cls" | "mean" | "last"
    normalize: bool  # the sentence-transformers pipeline ends in Normalize
    dtype: str
    device: str
    attention_backend: str
