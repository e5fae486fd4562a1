"""The next-token loss of the default GPT: the cross-entropy of each scored token.

The loss terms a run may add to it (`config.loss.terms`: z-loss, activation penalties, terms of
your own) are model/loss_terms.py's.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

Array = chex.Array

# The aux key of the plain next-token cross-entropy, logged beside the terms.
CROSS_ENTROPY = "cross_entropy"


def cross_entropy(logits_ExV: Array, targets_E: Array) -> Array:
    """losses_E: -log softmax(logits)[target] per token, as
    optax.softmax_cross_entropy_with_integer_labels computes it (logsumexp minus the target's
    logit), but with the target's logit squeezed out rather than gathered at index 0: the
    gradient of that gather is a scatter of constants, which XLA folds at compile time, for
    seconds per million tokens."""
    target_logits_E = jnp.take_along_axis(logits_ExV, targets_E[:, None], axis=-1).squeeze(-1)
    return jax.nn.logsumexp(logits_ExV, axis=-1) - target_logits_E
