"""sentence-transformers `Dense` modules after pooling: `activation(x W^T + b)`, plus the input (or its
projection) where the module has `use_residual`, as `sentence_transformers.models.Dense` computes it.

A module's settings come from its folder's config.json and its weights from `model.safetensors`, or
from `pytorch_model.bin` read with `torch.load(weights_only=True)`, which unpickles tensors and
nothing that runs code. Activations are looked up by name among torch's own (sentence-transformers
imports whatever class the config names); one outside that list refuses the model at load.
The layers run inside the served model's forward, after pooling and before the gateway normalises,
so a CUDA graph captures them with the rest; in float32, as the pooled rows are.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

from kembed.worker.errors import InvalidInput

# activation_function as sentence-transformers writes it (the class's full name) -> what computes it
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.modules.activation.ReLU": F.relu,
    "torch.nn.modules.activation.GELU": F.gelu,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
    "torch.nn.modules.activation.SiLU": F.silu,
}
_DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"  # Dense's default, where config.json names none
_EMBEDDING = "sentence_embedding"  # the pooled vector, which a Dense module after Pooling reads


@dataclass(frozen=True)
class DenseSpec:
    """One Dense module of the pipeline, as its config.json says (weights not read yet)."""

    path: Path
    in_features: int
    out_features: int
    has_bias: bool
    activation: str  # a key of ACTIVATIONS
    use_residual: bool

    @property
    def activation_name(self) -> str:
        return self.activation.rsplit(".", 1)[-1]


def read_dense(path: Path) -> DenseSpec:
    """The Dense module in folder `path`; InvalidInput naming what kembed does not apply."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise InvalidInput(f"the Dense module {path} has no config.json")
    config = json.loads(config_file.read_text())
    activation = str(config.get("activation_function") or _DEFAULT_ACTIVATION)
    if activation not in ACTIVATIONS:
        known = ", ".join(name.rsplit(".", 1)[-1] for name in ACTIVATIONS)
        raise InvalidInput(
            f"the Dense module {path} has activation {activation}, which kembed does not apply "
            f"(it applies {known})"
        )
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, _EMBEDDING) != _EMBEDDING:
            raise InvalidInput(
                f"the Dense module {path} has {key} {config[key]!r}: kembed applies a Dense module to "
                f"the pooled {_EMBEDDING!r} only"
            )
    return DenseSpec(
        path=path,
        in_features=int(config["in_features"]),
        out_features=int(config["out_features"]),
        has_bias=bool(config.get("bias", True)),
        activation=activation,
        use_residual=bool(config.get("use_residual", False)),
    )


def load_dense_weights(spec: DenseSpec) -> dict[str, torch.Tensor]:
    """The module's state dict (`linear.weight`, `linear.bias`, `residual.weight`) from its folder."""
    safetensors_file, pickled_file = spec.path / "model.safetensors", spec.path / "pytorch_model.bin"
    if safetensors_file.is_file():
        return load_file(safetensors_file)
    if pickled_file.is_file():
        weights: dict[str, torch.Tensor] = torch.load(pickled_file, map_location="cpu", weights_only=True)
        return weights
    raise InvalidInput(f"the Dense module {spec.path} has no model.safetensors or pytorch_model.bin")


class Dense(nn.Module):
    """One Dense module: [num_rows, in_features] float32 -> [num_rows, out_features] float32."""

    def __init__(self, spec: DenseSpec) -> None:
        super().__init__()
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.has_bias)
        self.residual = (
            nn.Linear(spec.in_features, spec.out_features, bias=False)
            if spec.use_residual and spec.in_features != spec.out_features
            else None
        )
        self.use_residual = spec.use_residual
        self._activation = ACTIVATIONS[spec.activation]

    @classmethod
    def load(cls, spec: DenseSpec, in_features: int) -> "Dense":
        """The module with its weights, fed rows of `in_features` (InvalidInput where it takes others)."""
        if spec.in_features != in_features:
            raise InvalidInput(
                f"the Dense module {spec.path} takes vectors of {spec.in_features}, but is fed "
                f"{in_features} (the model's hidden size, or the previous Dense module's output)"
            )
        dense = cls(spec)
        weights = load_dense_weights(spec)
        try:
            dense.load_state_dict(weights, strict=True)
        except RuntimeError as error:  # missing, unexpected or misshapen tensors
            raise InvalidInput(
                f"the Dense module {spec.path}'s weights do not fit its config: {error}"
            ) from None
        return dense

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        # float32 math whatever the model's dtype (the weights follow it: a cast, not a copy, in fp32)
        bias = None if self.linear.bias is None else self.linear.bias.float()
        out = self._activation(F.linear(rows, self.linear.weight.float(), bias))
        if self.use_residual:
            out = out + (rows if self.residual is None else F.linear(rows, self.residual.weight.float()))
        return out
