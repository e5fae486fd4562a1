"""Attention, MLP and LayerNorm: sequence-permutation equivariance, causality, RoPE."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from minigpt_jax import GPTConfig
from minigpt_jax.model.attention import MultiHeadAttention, attention_weights, causal_mask
from minigpt_jax.model.gpt import MLP
from minigpt_jax.model.positions import apply_rope

DIMS = chex.Dimensions(B=2, T=8, D=32, H=4, K=8)
CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=4, n_embd=32, dropout=0.0)
POSITIONS_1xT = jnp.arange(DIMS.T)[None, :]


def _x_BxTxD(seed=0):
    return jax.random.normal(jax.random.key(seed), DIMS["BTD"])


def _attention(cfg, weight_scale=1.0):
    """Initialised attention as a function of x; weight_scale > 1 sharpens the weights, since at
    the 0.02 init they are near uniform and positional effects are tiny."""
    module = MultiHeadAttention(cfg)
    params = module.init(jax.random.key(1), _x_BxTxD(), POSITIONS_1xT)
    params = jax.tree_util.tree_map(lambda w: w * weight_scale, params)
    return lambda x_BxTxD: module.apply(params, x_BxTxD, POSITIONS_1xT)[0]


class SequencePermutationTest(chex.TestCase):
    """f(x[:, p]) == f(x)[:, p] for maps that do not look at positions."""

    def _assert_equivariant(self, fn):
        x_BxTxD = _x_BxTxD()
        perm_T = jax.random.permutation(jax.random.key(7), DIMS.T)
        chex.assert_trees_all_close(
            fn(x_BxTxD[:, perm_T]), fn(x_BxTxD)[:, perm_T], atol=1e-5, rtol=1e-5
        )

    @chex.variants(with_jit=True, without_jit=True)
    def test_bidirectional_attention_without_positions(self):
        self._assert_equivariant(
            self.variant(_attention(CFG.replace(causal=False, pos_encoding="none")))
        )

    def test_mlp(self):
        module = MLP(CFG)
        params = module.init(jax.random.key(0), _x_BxTxD())
        self._assert_equivariant(lambda x: module.apply(params, x))

    def test_layer_norm(self):
        module = nn.LayerNorm()
        params = module.init(jax.random.key(0), _x_BxTxD())
        self._assert_equivariant(lambda x: module.apply(params, x))

    def test_causal_attention_is_not_equivariant(self):
        fn = _attention(CFG.replace(pos_encoding="none"), weight_scale=20.0)
        x_BxTxD = _x_BxTxD()
        perm_T = jnp.arange(DIMS.T)[::-1]
        self.assertGreater(
            float(jnp.abs(fn(x_BxTxD[:, perm_T]) - fn(x_BxTxD)[:, perm_T]).max()), 1e-3
        )

    def test_rope_attention_is_not_equivariant(self):
        fn = _attention(CFG.replace(causal=False, pos_encoding="rope"), weight_scale=20.0)
        x_BxTxD = _x_BxTxD()
        perm_T = jnp.arange(DIMS.T)[::-1]
        self.assertGreater(
            float(jnp.abs(fn(x_BxTxD[:, perm_T]) - fn(x_BxTxD)[:, perm_T]).max()), 1e-3
        )


class AttentionWeightsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_rows_sum_to_one_and_future_gets_zero_weight(self):
        q, k = jax.random.normal(jax.random.key(0), (2, *DIMS["BTHK"]))
        weights = self.variant(attention_weights)(q, k, causal_mask(POSITIONS_1xT, POSITIONS_1xT))
        chex.assert_shape(weights, DIMS["BHTT"])
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
        upper = np.triu(np.ones((DIMS.T, DIMS.T), bool), k=1)
        self.assertEqual(float(np.abs(np.asarray(weights)[..., upper]).max()), 0.0)

    def test_first_position_attends_only_to_itself(self):
        q, k = jax.random.normal(jax.random.key(0), (2, *DIMS["BTHK"]))
        weights = attention_weights(q, k, causal_mask(POSITIONS_1xT, POSITIONS_1xT))
        np.testing.assert_allclose(weights[:, :, 0, 0], 1.0)


class RopeTest(chex.TestCase):
    @parameterized.parameters(1, 5)
    def test_scores_depend_only_on_relative_position(self, shift):
        q, k = jax.random.normal(jax.random.key(0), (2, 1, DIMS.T, DIMS.H, DIMS.K))
        pos_1xT = jnp.arange(DIMS.T)[None]
        scores = jnp.einsum("bthk,bshk->bhts", apply_rope(q, pos_1xT), apply_rope(k, pos_1xT))
        shifted = jnp.einsum(
            "bthk,bshk->bhts", apply_rope(q, pos_1xT + shift), apply_rope(k, pos_1xT + shift)
        )
        chex.assert_trees_all_close(scores, shifted, atol=1e-4, rtol=1e-4)

    def test_rotation_preserves_norms(self):
        x = jax.random.normal(jax.random.key(0), DIMS["BTHK"])
        rotated = apply_rope(x, jnp.arange(DIMS.T)[None] * 13)
        chex.assert_trees_all_close(
            jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(x, axis=-1), atol=1e-5, rtol=1e-5
        )
