"""Shared test setup: strict numerics and small, shared models (compile time dominates)."""

import jax

# Implicit rank promotion hides shape bugs; full-precision matmuls keep GPU (TF32) runs honest.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "float32")
