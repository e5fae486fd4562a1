"""How one token is drawn from a row of logits: top-k and nucleus filters, temperature or greedy
argmax (`sample_token`), and each prompt's own key (`row_keys`)."""

from __future__ import annotations

from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

Array = chex.Array


def top_k_filter(logits_BxV: Array, k: int | Array) -> Array:
    """Logits with all but the k largest of each row set to -inf (ties with the k-th are kept).

    k (1 <= k <= V) may be traced, so changing it does not recompile.
    """
    sorted_BxV = jnp.sort(logits_BxV, axis=-1)
    kth_Bx1 = jax.lax.dynamic_slice_in_dim(sorted_BxV, logits_BxV.shape[-1] - k, 1, axis=-1)
    return jnp.where(logits_BxV >= kth_Bx1, logits_BxV, -jnp.inf)


def top_p_filter(logits_BxV: Array, p: float | Array) -> Array:
    """Nucleus filter (Holtzman et al. 2019, arXiv:1904.09751): keep the fewest most-likely
    tokens whose probability reaches p (0 < p <= 1; the most likely token always stays), -inf
    elsewhere. p may be traced."""
    sorted_BxV = jnp.flip(jnp.sort(logits_BxV, axis=-1), axis=-1)
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
    num_kept_Bx1 = jnp.sum(mass_before_BxV < p, axis=-1, keepdims=True)
    threshold_Bx1 = jnp.take_along_axis(sorted_BxV, num_kept_Bx1 - 1, axis=-1)
    return jnp.where(logits_BxV >= threshold_Bx1, logits_BxV, -jnp.inf)


def sample_token(
    logits_BxV: Array,
    rng: Array,
    temperature: float | Array = 1.0,
    top_k: int | Array | None = None,
    top_p: float | Array | None = None,
) -> Array:
    """ids_B: argmax where temperature == 0, else a draw from softmax(logits / temperature)
    after the optional top-k, then top-p, filter (the order of nanoGPT and HF transformers)."""
    chex.assert_rank(logits_BxV, 2)
    greedy_B = jnp.argmax(logits_BxV, axis=-1)
    logits_BxV = logits_BxV / jnp.where(temperature > 0, temperature, 1.0)
    if top_k is not None:
        logits_BxV = top_k_filter(logits_BxV, top_k)
    if top_p is not None:
        logits_BxV = top_p_filter(logits_BxV, top_p)
    sampled_B = jax.random.categorical(rng, logits_BxV, axis=-1)
    return jnp.where(temperature > 0, sampled_B, greedy_B).astype(jnp.int32)


def row_keys(rng: Array, rows: Sequence[int] | np.ndarray) -> Array:
    """rngs_B: prompt i's key is fold_in(rng, i), so a row's draws do not depend on its batch."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, np.asarray(rows, np.uint32))
