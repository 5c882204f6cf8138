"""LLM rerankers (Qwen3-Reranker, mxbai-rerank-v2): a causal LM scored as sentence-transformers'
CrossEncoder scores it with `LogitScore`: logit(true) - logit(false) at each pair's last token.

The gateway renders each (query, document) pair through the directory's chat template; here the
decoder (Qwen3 or Qwen2, decoder.py) runs over the packed pairs, the last token of each is taken,
and it meets only the rows of the LM head the score reads (logit_score.py: "yes" and "no" for
Qwen3-Reranker): [num_seqs, hidden] x [hidden, 2], never the [hidden, vocabulary] product a
generating model computes. The rows are `lm_head.weight`'s, or the token embeddings' where
`tie_word_embeddings` ties them, as transformers' *ForCausalLM does; the product is in float32.
The answer is one raw logit a pair, as the BERT cross-encoders' (the gateway applies the sigmoid).
"""

import torch
from torch import nn

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.pooling import pool
from kembed.worker.engine.models.decoder import Decoder, DecoderShape
from kembed.worker.engine.models.logit_score import LogitScoreSpec
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.served import ModelFacts, ServedModel
from kembed.worker.errors import InvalidInput


class LogitScorer(ServedModel):
    """Decoder + the LM head's rows of the true (and false) token; capturable, no host syncs."""

    def __init__(self, shape: DecoderShape, attend: Attention, num_rows: int) -> None:
        super().__init__()
        self.decoder = Decoder(shape, attend)
        # [num_rows, hidden]: the LM head's rows the score reads, true first (the model's dtype)
        self.score_rows = nn.Parameter(torch.zeros(num_rows, shape.hidden_size), requires_grad=False)
        self.facts = ModelFacts("score", 1, shape.max_sequence_length, shape.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_seqs, 1] float32
        hidden = self.decoder(input_ids, position_ids, meta)  # token types: a decoder has none
        last = pool(hidden, meta, "last")  # [num_seqs, hidden]; safe on a bucket's empty slots
        logits = last.float() @ self.score_rows.float().t()  # [num_seqs, num_rows]
        score = logits[:, :1] if logits.shape[1] == 1 else logits[:, :1] - logits[:, 1:2]
        return score.contiguous()

    @classmethod
    def load(
        cls, model_dir: ModelDir, shape: DecoderShape, spec: LogitScoreSpec, attend: Attention
    ) -> "LogitScorer":
        """Build from a *ForCausalLM directory with a LogitScore module, weights loaded."""
        for token_id in spec.token_ids:
            if not 0 <= token_id < shape.vocab_size:
                raise InvalidInput(
                    f"{model_dir.path}: LogitScore reads token id {token_id}, outside the vocabulary "
                    f"({shape.vocab_size})"
                )
        weights = load_weights(model_dir.path)  # "model." stripped; lm_head keeps its name
        is_tied = bool(model_dir.config.get("tie_word_embeddings", False))
        head_name = "embed_tokens.weight" if is_tied else "lm_head.weight"
        if head_name not in weights:
            raise InvalidInput(
                f"{model_dir.path} has no lm_head.weight and config.json does not tie it to the token "
                "embeddings (tie_word_embeddings): an LLM reranker scores with its LM head's rows"
            )
        model = cls(shape, attend, len(spec.token_ids))
        model.decoder.load_hf_weights(weights)
        with torch.no_grad():
            model.score_rows.copy_(weights[head_name][list(spec.token_ids)])
        return model
