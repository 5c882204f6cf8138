"""Task LoRA adapters chosen per token: every sequence of a packed batch runs with its own task's
low-rank update (jina-embeddings-v3's retrieval.query beside retrieval.passage in one step), on the
CPU and inside a CUDA graph alike.

A linear's weight under task t is W + B[t] @ A[t] * scaling (A [rank, in], B [out, rank]); an
embedding table's W + A[t] @ B[t] * scaling (A [vocab, rank], B [rank, dim]). Rather than merge one
task into W, every task's factors sit side by side (A_cat [tasks * rank, in], B_cat [out, tasks *
rank]) and a token's update is B_cat @ ((A_cat @ x) * mask), where the batch's mask [num_tokens,
tasks * rank] is 1 on the token's task's rank columns and 0 elsewhere (all 0: the base weights). That
is each token's own task exactly, at the cost of two skinny matmuls (rank 4 x 5 tasks: 20 columns)
beside the layer's own, and one set of weights for every task.
"""

import torch
import torch.nn.functional as F
from torch import nn


class TaskMask:
    """The batch's mask, shared by every adapted module of one model: set once a forward (`select`)
    before the layers run, read by each. One launcher thread runs a model, so one is in use."""

    def __init__(self, num_tasks: int, rank: int) -> None:
        self.num_tasks, self.rank = num_tasks, rank
        self.mask: torch.Tensor | None = None

    def select(self, tasks: torch.Tensor, dtype: torch.dtype) -> None:
        """Each token's task [num_tokens] (-1: the base weights, t: task t) as the mask the modules read."""
        columns = torch.arange(self.num_tasks * self.rank, device=tasks.device) // self.rank
        self.mask = (columns[None, :] == tasks[:, None]).to(dtype)

    def read(self) -> torch.Tensor:
        if self.mask is None:
            raise RuntimeError("a task-adapted module ran before its model selected the batch's tasks")
        return self.mask


class TaskLoRALinear(nn.Linear):
    """nn.Linear plus every task's low-rank update, each token taking its own task's (TaskMask).
    A subclass so the layers that hold a linear keep their names and code; fused paths that read
    `weight` directly must take the eager one for it (kernels/fused.py checks the type)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tasks: TaskMask) -> None:
        super().__init__(in_features, out_features, bias=bias)
        width = tasks.num_tasks * tasks.rank
        self.lora_a = nn.Parameter(torch.zeros(width, in_features), requires_grad=False)
        self.lora_b = nn.Parameter(torch.zeros(out_features, width), requires_grad=False)  # scaled
        self.tasks = tasks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(x, self.lora_a) * self.tasks.read(), self.lora_b)
        return F.linear(x, self.weight, self.bias) + update


class TaskLoRAEmbedding(nn.Embedding):
    """nn.Embedding plus every task's low-rank update of its table, per token (TaskMask)."""

    def __init__(self, num_embeddings: int, dim: int, tasks: TaskMask) -> None:
        super().__init__(num_embeddings, dim)
        width = tasks.num_tasks * tasks.rank
        self.lora_a = nn.Parameter(torch.zeros(num_embeddings, width), requires_grad=False)
        self.lora_b = nn.Parameter(torch.zeros(width, dim), requires_grad=False)  # scaled
        self.tasks = tasks

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        update = (F.embedding(ids, self.lora_a) * self.tasks.read()) @ self.lora_b
        return F.embedding(ids, self.weight) + update


def side_by_side_linear(
    a: torch.Tensor, b: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_cat [tasks * rank, in], B_cat [out, tasks * rank], scaled) from per-task factors
    A [tasks, rank, in], B [tasks, out, rank]."""
    num_tasks, rank, _ = a.shape
    a_cat = a.float().reshape(num_tasks * rank, -1)
    b_cat = b.float().permute(1, 0, 2).reshape(b.shape[1], num_tasks * rank) * scaling
    return a_cat, b_cat


def side_by_side_embedding(
    a: torch.Tensor, b: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_cat [vocab, tasks * rank], B_cat [tasks * rank, dim], scaled) from per-task factors
    A [tasks, vocab, rank], B [tasks, rank, dim]."""
    num_tasks, vocab, rank = a.shape
    a_cat = a.float().permute(1, 0, 2).reshape(vocab, num_tasks * rank)
    b_cat = b.float().reshape(num_tasks * rank, -1) * scaling
    return a_cat, b_cat
