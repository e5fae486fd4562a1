"""Attention, MLP and LayerNorm: sequence-permutation equivariance, causality, RoPE."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from minigpt_jax import GPTConfig
from minigpt_jax.model.attention import MultiHeadAttention, attention_weights, causal_mask
from minigpt_jax.model.blocks import MLP
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


# ----------------------------------------------------------------------------- attention scores


def _numpy_alibi_slopes(n_head, max_bias=8.0):
    """Press et al.'s `get_slopes` (their repository's code), in plain Python."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(np.log2(n) - 3)))  # 2^(-8/n)
        return [start * start**i for i in range(n)]

    if max_bias != 8.0:
        return np.array([2.0 ** (-max_bias * (h + 1) / n_head) for h in range(n_head)])
    if np.log2(n_head).is_integer():
        return np.array(power_of_2(n_head))
    closest = 2 ** int(np.floor(np.log2(n_head)))
    return np.array(power_of_2(closest) + power_of_2(2 * closest)[0::2][: n_head - closest])


class AttentionScoreTest(parameterized.TestCase):
    @parameterized.parameters(1, 2, 4, 6, 8, 12)
    def test_alibi_slopes_are_the_papers(self, heads):
        from minigpt_jax.model.variants.attention import alibi_slopes

        np.testing.assert_allclose(alibi_slopes(heads), _numpy_alibi_slopes(heads), rtol=1e-6)

    def test_alibi_adds_minus_slope_times_distance(self):
        from minigpt_jax.model.variants.attention import alibi

        cfg = CFG.replace(attention_score="alibi", entry_settings=(("alibi_max_bias", 4.0),))
        scores_BxHxTxS = np.random.default_rng(0).normal(size=(2, 4, 3, 5)).astype(np.float32)
        q_BxT = np.array([[2, 3, 4], [0, 1, 2]])
        k_BxS = np.array([[0, 1, 2, 3, 4], [-1, -1, 0, 1, 2]])
        out = alibi(jnp.asarray(scores_BxHxTxS), jnp.asarray(q_BxT), jnp.asarray(k_BxS), cfg)
        slopes = _numpy_alibi_slopes(4, 4.0)
        expected = scores_BxHxTxS - slopes[None, :, None, None] * np.abs(
            q_BxT[:, None, :, None] - k_BxS[:, None, None, :]
        )
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)

    def test_softcap_is_cap_tanh(self):
        from minigpt_jax.model.variants.attention import softcap

        cfg = CFG.replace(attention_score="softcap", entry_settings=(("attention_softcap", 5.0),))
        scores = np.linspace(-40, 40, 24, dtype=np.float32).reshape(1, 2, 3, 4)
        out = softcap(jnp.asarray(scores), None, None, cfg)
        np.testing.assert_allclose(out, 5.0 * np.tanh(scores / 5.0), rtol=1e-6)
        self.assertLessEqual(float(jnp.abs(out).max()), 5.0)

    def test_attention_with_alibi_is_numpy_softmax_of_biased_scores(self):
        """The whole module: softmax(q·kᵀ/√K − m_h·|t − s|, causal) in NumPy from its q, k."""
        cfg = CFG.replace(attention_score="alibi", pos_encoding="none")
        module = MultiHeadAttention(cfg)
        x_BxTxD = _x_BxTxD()
        variables = module.init(jax.random.key(1), x_BxTxD, POSITIONS_1xT)
        _, state = module.apply(variables, x_BxTxD, POSITIONS_1xT, mutable=["intermediates"])
        weights = np.asarray(state["intermediates"]["attention_weights"][0])
        qkv = jax.tree.map(np.asarray, nn.unbox(variables)["params"]["qkv"])
        proj = np.einsum("btd,dihk->btihk", np.asarray(x_BxTxD), qkv["kernel"]) + qkv["bias"]
        q, k = proj[:, :, 0], proj[:, :, 1]
        scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(DIMS.K)
        t = np.arange(DIMS.T)
        scores = scores - _numpy_alibi_slopes(4)[None, :, None, None] * np.abs(t[:, None] - t)
        scores = np.where(t[None, None, :, None] >= t, scores, -np.inf)
        expected = np.exp(scores - scores.max(-1, keepdims=True))
        expected /= expected.sum(-1, keepdims=True)
        np.testing.assert_allclose(weights, expected, rtol=1e-4, atol=1e-6)

    # A cap of 0.01 bites at the init's small scores; Gemma 2's 50 would not.
    @parameterized.parameters(
        ("alibi", ()), ("relative", ()), ("softcap", (("attention_softcap", 0.01),))
    )
    def test_cached_decode_equals_the_uncached_forward(self, score, settings):
        """Token by token through the KV cache, the logits are the full forward's."""
        from minigpt_jax.model.gpt import forward, forward_with_cache, init_cache, init_params

        cfg = CFG.replace(
            n_layer=2, attention_score=score, pos_encoding="none", entry_settings=settings
        )
        params = init_params(cfg, jax.random.key(0))
        tokens_BxT = jax.random.randint(jax.random.key(5), (2, 7), 0, cfg.vocab_size)
        full_BxTxV = forward(params, tokens_BxT, cfg)
        cache = init_cache(cfg, 2, 7)
        steps = []
        for t in range(7):
            positions_BxT = jnp.full((2, 1), t)
            logits, cache = forward_with_cache(
                params, tokens_BxT[:, t : t + 1], positions_BxT, cache, cfg
            )
            steps.append(logits)
        np.testing.assert_allclose(jnp.concatenate(steps, 1), full_BxTxV, rtol=1e-4, atol=1e-5)
        plain = forward(params, tokens_BxT, cfg.replace(attention_score="none"))
        self.assertFalse(np.allclose(plain, full_BxTxV, atol=1e-5))  # the score does something

    def test_relative_bias_buckets_are_t5s(self):
        """T5's buckets (mesh-tensorflow's `_relative_position_bucket`), here in NumPy."""
        from minigpt_jax.model.variants.attention import relative_bucket

        def numpy_bucket(relative, bidirectional, num_buckets=32, max_distance=128):
            ret, n = 0, -relative
            if bidirectional:
                num_buckets //= 2
                ret += (n < 0) * num_buckets
                n = abs(n)
            else:
                n = max(n, 0)
            max_exact = num_buckets // 2
            if n < max_exact:
                return ret + n
            large = max_exact + int(
                np.log(n / max_exact) / np.log(max_distance / max_exact) * (num_buckets - max_exact)
            )
            return ret + min(large, num_buckets - 1)

        relative = np.arange(-300, 300)
        for causal in (True, False):
            got = relative_bucket(jnp.asarray(relative), causal, 32, 128)
            want = [numpy_bucket(int(r), not causal) for r in relative]
            np.testing.assert_array_equal(got, want)

    def test_fused_kernels_refuse_a_score_naming_explicit(self):
        for kernel in ("xla", "cudnn"):
            with self.assertRaisesRegex(ValueError, "model.attention=explicit"):
                CFG.replace(attention=kernel, attention_score="alibi")

    def test_auto_takes_the_explicit_path_under_a_score(self):
        from minigpt_jax.model.speed.kernels import choose_kernel

        cfg = CFG.replace(attention_score="alibi")
        for cached in (False, True):
            kernel = choose_kernel(cfg, weight_dropout=False, cached=cached)
            self.assertEqual(kernel, "explicit")
