"""minigpt-jax: a small GPT in JAX/Flax whose invariants are checked, not assumed."""

from minigpt_jax.io.pretrained import load_gpt2, save_gpt2
from minigpt_jax.io.sampling import generate
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.embeddings import Embeddings, check_token_ids
from minigpt_jax.model.gpt import (
    GPT,
    checked_forward,
    count_params,
    flops_per_token,
    forward,
    forward_with_attention,
    init_params,
    next_token_losses,
    vocab_padding_params,
)
from minigpt_jax.model.positions import POSITION_ENCODINGS, PositionEncoding, sinusoidal_positions

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "POSITION_ENCODINGS",
    "Embeddings",
    "GPTConfig",
    "PositionEncoding",
    "check_token_ids",
    "checked_forward",
    "count_params",
    "flops_per_token",
    "forward",
    "forward_with_attention",
    "generate",
    "init_params",
    "load_gpt2",
    "next_token_losses",
    "save_gpt2",
    "sinusoidal_positions",
    "vocab_padding_params",
]
