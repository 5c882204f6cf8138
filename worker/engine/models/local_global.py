"""Config fields of models that alternate global layers with local (sliding-window) ones, each kind
with its own RoPE base: ModernBERT and Gemma 3. Old configs spell them flat (`global_rope_theta`,
`rope_local_base_freq`, `global_attn_every_n_layers`); transformers 5 writes `layer_types` and
`rope_parameters` per layer type. Both are read, as transformers reads them.
"""

from typing import Any

from kembed.worker.errors import InvalidInput


def rope_thetas(
    config: dict[str, Any], defaults: tuple[float, float], local_key: str, global_key: str
) -> tuple[float, float]:
    """(global, local) RoPE bases: transformers 5's `rope_parameters` per layer type, else the older
    flat keys; a scaled RoPE is refused, naming its type."""
    params = config.get("rope_parameters") or {}
    if config.get("rope_scaling"):
        params = {"full_attention": config["rope_scaling"]}
    thetas = []
    for layer_type, key, default in (
        ("full_attention", global_key, defaults[0]),
        ("sliding_attention", local_key, defaults[1]),
    ):
        layer = params.get(layer_type) or {}
        rope_type = layer.get("rope_type", layer.get("type", "default"))
        if rope_type != "default":
            raise InvalidInput(
                f"rope type {rope_type!r} of the {layer_type} layers is not supported (only unscaled RoPE)"
            )
        thetas.append(float(layer.get("rope_theta") or config.get(key) or default))
    return thetas[0], thetas[1]


def layer_types(
    config: dict[str, Any], every_n_key: str, default_every: int, global_last: bool
) -> tuple[bool, ...]:
    """Per layer, whether it is a local (sliding-window) one: `layer_types` where the config has it,
    else one global layer in every `every_n_key` (the first of each run, or the last: Gemma's)."""
    num_layers = config["num_hidden_layers"]
    types = config.get("layer_types")
    if types:
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown or len(types) != num_layers:
            raise InvalidInput(
                f"layer_types {types} are not {num_layers} of full_attention, sliding_attention"
            )
        return tuple(t == "sliding_attention" for t in types)
    every = int(config.get(every_n_key) or default_every)
    return tuple(bool((i + global_last) % every) for i in range(num_layers))
