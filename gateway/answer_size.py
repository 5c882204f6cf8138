"""What an answer weighs once encoded, estimated before it is built: the gateway refuses (413) one
past `GatewayConfig.max_answer_bytes` before the model runs, rather than build it in memory.

The estimate is per vector component, by the encoding it is written in, per vector (its brackets
or quotes and comma), per sparse entry, and per input (its item's keys).
"""

from __future__ import annotations

from collections.abc import Iterable

from kembed.gateway.errors import PayloadTooLarge

# Bytes one vector component takes in the answer. Float JSON: orjson writes a float32 in its
# shortest form, 11.7-12.4 bytes with its comma measured on unit vectors of 32-1024 dimensions
# (more digits where components are small), so 13 bounds it. base64 of float32: 4 bytes as 16/3
# characters; of int8: 4/3; of packed bits: 1/6. Cohere's integer lists: up to "-127," a value;
# its packed binary types one such integer per 8 values.
VALUE_BYTES: dict[str, float] = {
    "float": 13.0,
    "base64": 16 / 3,
    "base64_int8": 4 / 3,
    "base64_binary": 1 / 6,
    "int8": 5.0,
    "uint8": 4.0,
    "binary": 5 / 8,
    "ubinary": 4 / 8,
}

# One sparse entry: TEI's `{"index":250001,"value":0.12345678},` (33 bytes for a 6-digit id);
# the OpenAI route's `indices` and `values` lists take less.
SPARSE_ENTRY_BYTES = 33.0
ROW_BYTES = 4.0  # a vector's `[...],` or `"...",` (and base64's padding, on average)
ITEM_BYTES = 64.0  # an input's item: `{"object":"embedding","index":2047,"embedding":...}` and the like


def vectors(num_vectors: int, width: int, value_bytes: float) -> float:
    """Bytes of `num_vectors` vectors of `width` components, each `value_bytes`."""
    return num_vectors * (width * value_bytes + ROW_BYTES)


def value_bytes(encodings: Iterable[str | None]) -> float:
    """Bytes a component takes in every encoding asked (Cohere's `embedding_types` give several):
    None is float."""
    return sum(VALUE_BYTES[encoding or "float"] for encoding in encodings)


def check(estimate: float, limit: int, what: str, hint: str) -> None:
    """PayloadTooLarge (413) naming the estimate, `what` was counted, the limit and `hint` (what to
    send instead), if `estimate` bytes are past `limit`."""
    if estimate > limit:
        raise PayloadTooLarge(
            f"the answer would be about {estimate:,.0f} bytes ({what}), more than the limit of "
            f"{limit:,} (--max-answer-bytes); {hint}"
        )
