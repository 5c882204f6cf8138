"""layers/rope.py's layouts against transformers' own rotary functions: rotate-half over the whole
head (Llama), over its first dimensions only (GPT-NeoX's partial rotary, nomic's
rotary_emb_fraction < 1) and interleaved pairs (GPT-J, nomic's rotary_emb_interleaved); and
DistilBERT's sinusoidal position table."""

import pytest
import torch
from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_rotary
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_rotary

from kembed.worker.engine.layers.rope import RotaryEmbedding, ntk_scaling, rotate
from kembed.worker.engine.models.distilbert import sinusoidal_table

NUM_TOKENS, NUM_HEADS, HEAD_DIM, THETA = 37, 3, 32, 1000.0


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(NUM_TOKENS, NUM_HEADS, HEAD_DIM)
    positions = torch.cat([torch.arange(20), torch.arange(17)])  # two packed sequences
    return x, positions


def angles(rotary_dim: int, positions: torch.Tensor) -> torch.Tensor:
    inv_freq = 1.0 / (THETA ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    return positions[:, None].float() * inv_freq  # [tokens, rotary_dim/2]


@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, HEAD_DIM // 2], ids=["whole-head", "partial-half"])
def test_rotate_half_matches_gpt_neox_over_whole_or_partial_heads(rotary_dim):
    x, positions = inputs()
    cos, sin = RotaryEmbedding(rotary_dim, 64, THETA)(positions)
    emb = torch.cat([angles(rotary_dim, positions)] * 2, dim=-1)  # transformers' duplicated table
    want, _ = neox_rotary(x.transpose(0, 1)[None], x.transpose(0, 1)[None], emb.cos()[None], emb.sin()[None])
    torch.testing.assert_close(rotate(x, cos, sin), want[0].transpose(0, 1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, HEAD_DIM // 2], ids=["whole-head", "partial-half"])
def test_interleaved_matches_gpt_j(rotary_dim):
    x, positions = inputs()
    cos, sin = RotaryEmbedding(rotary_dim, 64, THETA)(positions)
    theta = angles(rotary_dim, positions)
    turned = gptj_rotary(x[None, :, :, :rotary_dim], theta.sin()[None], theta.cos()[None])[0]
    want = torch.cat([turned, x[..., rotary_dim:]], dim=-1)
    torch.testing.assert_close(rotate(x, cos, sin, interleaved=True), want, rtol=1e-6, atol=1e-6)


def test_layouts_differ():
    x, positions = inputs()
    cos, sin = RotaryEmbedding(HEAD_DIM, 64, THETA)(positions)
    assert not torch.allclose(rotate(x, cos, sin), rotate(x, cos, sin, interleaved=True), atol=1e-3)


def test_fixed_ntk_divides_the_frequencies_of_theta_times_the_factor():
    theta, divisor = ntk_scaling(THETA, 2.0, HEAD_DIM)
    scaled = RotaryEmbedding(HEAD_DIM, 64, theta, divisor)
    inv_freq = 1.0 / ((THETA * 2.0) ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    inv_freq = inv_freq / 2.0 ** (2 / HEAD_DIM)  # Alibaba's NTKScalingRotaryEmbedding, mixed_b unset
    torch.testing.assert_close(scaled.cos, (torch.arange(64).float()[:, None] * inv_freq).cos())


def test_distilbert_sinusoidal_table_is_transformers():
    want = create_sinusoidal_embeddings(130, 48, torch.empty(130, 48))
    torch.testing.assert_close(sinusoidal_table(130, 48), want, rtol=0, atol=0)
