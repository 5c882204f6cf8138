"""The encoder MLPs over packed tokens [num_tokens, hidden]: the plain one (up, activation, down:
BERT's, XLM-R's, jina-embeddings-v3's) and the gated one (GLU: act(x W_gate) * (x W_up), then down:
NomicBERT's SwiGLU, GTE's GeGLU), with the gate and up projections fused into one matmul at load.

On CUDA the plain MLP's GELU runs in its up-projection's cuBLASLt epilogue (`linear_activation`,
kernels/fused.py, as BERT's layers do) and the gated MLP's SiLU gate in one Triton kernel
(`silu_mul`, as Qwen3's layers do: float32 in registers, rounded once); every other activation runs
as torch computes it.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kembed.worker.engine.kernels.fused import linear_activation
from kembed.worker.engine.kernels.fused_decoder import can_run, silu_mul
from kembed.worker.errors import InvalidInput

# hidden_act as transformers' ACT2FN names them -> what computes them
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation `name` (config.json `hidden_act`); InvalidInput naming the ones served."""
    if name not in ACTIVATIONS:
        raise InvalidInput(f"unsupported hidden_act {name!r} (served: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


class DenseMLP(nn.Module):
    """down(act(up(x))), both linears with biases."""

    def __init__(self, hidden: int, intermediate: int, activation_name: str) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)
        self.activation_name = activation_name
        self.activation = activation(activation_name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(linear_activation(x, self.up, self.activation_name, self.activation))
        return out


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); `gate_up` holds [gate; up] stacked on the output dimension."""

    def __init__(
        self, hidden: int, intermediate: int, activation_name: str, *, gate_up_bias: bool, down_bias: bool
    ) -> None:
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=gate_up_bias)
        self.down = nn.Linear(intermediate, hidden, bias=down_bias)
        self.activation_name = activation_name
        self.activation = activation(activation_name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(x)
        if can_run(gate_up) and self.activation_name in ("silu", "swish"):
            fused: torch.Tensor = self.down(silu_mul(gate_up))
            return fused
        gate, up = gate_up.chunk(2, dim=-1)
        out: torch.Tensor = self.down(self.activation(gate) * up)
        return out

    def load_split(
        self, gate: dict[str, torch.Tensor], up: dict[str, torch.Tensor], down: dict[str, torch.Tensor]
    ) -> None:
        """Load the separate gate, up and down state dicts (`weight`, and `bias` where the linears
        have one), fusing gate and up."""
        state = {f"gate_up.{kind}": torch.cat([gate[kind], up[kind]]) for kind in gate}
        state.update({f"down.{kind}": tensor for kind, tensor in down.items()})
        self.load_state_dict(state, strict=True)
