"""What sentence-transformers' `LogitScore` module (a CrossEncoder on a causal LM: Qwen3-Reranker,
mxbai-rerank-v2) saves in its folder: which vocabulary rows the relevance score reads.

`CrossEncoder(dir)` of a `*ForCausalLM` directory builds `Transformer(transformer_task=
"text-generation")` then `LogitScore(true_token_id=<"yes">, false_token_id=<"no">)`, and `save`
writes both into modules.json, the ids into the module folder's config.json. The score of a pair is
logit(true) - logit(false) at the last token (logit(true) alone without a false id).
"""

import json
from dataclasses import dataclass
from pathlib import Path

from kembed.worker.errors import InvalidInput


@dataclass(frozen=True)
class LogitScoreSpec:
    """A LogitScore module's settings (its config.json)."""

    true_token_id: int
    false_token_id: int | None  # None: the score is logit(true) alone

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The vocabulary rows the score reads, the true one first."""
        return (
            (self.true_token_id,)
            if self.false_token_id is None
            else (self.true_token_id, self.false_token_id)
        )


def read_logit_score(module_dir: Path) -> LogitScoreSpec:
    """The LogitScore module at `module_dir`; InvalidInput for one kembed does not apply."""
    file = module_dir / "config.json"
    config = json.loads(file.read_text()) if file.is_file() else {}
    true_id, false_id = config.get("true_token_id"), config.get("false_token_id")
    if not isinstance(true_id, int) or not (false_id is None or isinstance(false_id, int)):
        raise InvalidInput(f"{file}: a LogitScore module names an integer true_token_id (and false_token_id)")
    source = config.get("module_input_name", "causal_logits")
    if source != "causal_logits":
        raise InvalidInput(f"{file}: LogitScore reads {source!r}; kembed serves it on the causal LM's logits")
    return LogitScoreSpec(true_id, false_id)
