"""GPT: shapes, equivariance, causality, weight tying, parameter counts, bad inputs."""

import functools
import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from configs import gpt2_small
from minigpt_jax import (
    GPT,
    GPTConfig,
    checked_forward,
    count_params,
    flops_per_token,
    forward,
    forward_with_attention,
    init_params,
    next_token_losses,
    vocab_padding_params,
)
from minigpt_jax.config_dict import gpt_config_from

DIMS = chex.Dimensions(B=2, T=8, D=32, H=4, V=64, N=2)
CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


@functools.cache
def _params(cfg: GPTConfig, seed: int = 0):
    return init_params(cfg, jax.random.key(seed))


def _tokens(seed=1, shape=None):
    return jax.random.randint(jax.random.key(seed), shape or DIMS["BT"], 0, DIMS.V)


def _loss(params, cfg, tokens_BxT1):
    return next_token_losses(params, tokens_BxT1, cfg).mean()


class ForwardTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        ("learned", "learned"), ("sinusoidal", "sinusoidal"), ("rope", "rope"), ("none", "none")
    )
    def test_shapes_dtypes_finite(self, scheme):
        cfg = CFG.replace(pos_encoding=scheme)
        logits = self.variant(functools.partial(forward, cfg=cfg))(_params(cfg), _tokens())
        chex.assert_shape(logits, DIMS["BTV"])
        chex.assert_type(logits, jnp.float32)
        chex.assert_tree_all_finite(logits)

    def test_module_api_matches_pure_function(self):
        tokens = _tokens()
        variables = GPT(CFG).init(jax.random.key(0), tokens)
        logits, cache = GPT(CFG).apply(variables, tokens, deterministic=True)
        self.assertIsNone(cache)  # one shape of result: (logits, cache or None)
        chex.assert_trees_all_close(
            logits, forward(variables["params"], tokens, CFG), rtol=0, atol=0
        )

    def test_next_token_losses_are_minus_log_softmax_at_the_targets(self):
        params, tokens_BxT1 = _params(CFG), _tokens()
        logits_BxTxV = np.asarray(forward(params, tokens_BxT1[:, :-1], CFG), np.float64)
        log_probs_BxTxV = logits_BxTxV - np.log(np.exp(logits_BxTxV).sum(-1, keepdims=True))
        targets_BxT = np.asarray(tokens_BxT1[:, 1:])
        expected_BxT = -np.take_along_axis(log_probs_BxTxV, targets_BxT[..., None], -1)[..., 0]
        np.testing.assert_allclose(
            next_token_losses(params, tokens_BxT1, CFG), expected_BxT, rtol=1e-5, atol=1e-5
        )

    def test_bfloat16_compute_keeps_float32_params_and_logits(self):
        cfg = CFG.replace(dtype="bfloat16")
        params = _params(cfg)
        chex.assert_trees_all_equal_dtypes(params, jax.tree_util.tree_map(jnp.float32, params))
        logits = forward(params, _tokens(), cfg)
        chex.assert_type(logits, jnp.float32)
        ref = forward(params, _tokens(), CFG)
        chex.assert_trees_all_close(logits, ref, atol=5e-2, rtol=5e-2)

    def test_loss_at_init_is_about_log_vocab(self):
        loss = float(_loss(_params(CFG), CFG, _tokens(shape=(8, 17))))
        self.assertAlmostEqual(loss, math.log(DIMS.V), delta=0.1)

    def test_batch_permutation_equivariance(self):
        tokens = _tokens(shape=(4, DIMS.T))
        perm_B = jnp.array([2, 0, 3, 1])
        logits = forward(_params(CFG), tokens, CFG)
        chex.assert_trees_all_close(
            forward(_params(CFG), tokens[perm_B], CFG), logits[perm_B], atol=1e-5, rtol=1e-5
        )

    def test_attention_weights_are_returned_per_layer(self):
        logits, weights = forward_with_attention(_params(CFG), _tokens(), CFG)
        self.assertLen(weights, DIMS.N)
        for w in weights:
            chex.assert_shape(w, DIMS["BHTT"])
            np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        chex.assert_trees_all_close(logits, forward(_params(CFG), _tokens(), CFG), atol=0, rtol=0)


class DropoutTest(chex.TestCase):
    def test_randomness_comes_only_from_rng(self):
        cfg = CFG.replace(dropout=0.5)
        params, tokens = _params(cfg), _tokens()
        run = functools.partial(forward, params, tokens, cfg, train=True)
        chex.assert_trees_all_equal(run(rng=jax.random.key(3)), run(rng=jax.random.key(3)))
        self.assertFalse(np.allclose(run(rng=jax.random.key(3)), run(rng=jax.random.key(4))))
        # Evaluation ignores dropout entirely.
        self.assertFalse(np.allclose(run(rng=jax.random.key(3)), forward(params, tokens, cfg)))

    def test_training_without_rng_is_refused(self):
        with self.assertRaisesRegex(ValueError, "needs an `rng`"):
            forward(
                _params(CFG.replace(dropout=0.5)), _tokens(), CFG.replace(dropout=0.5), train=True
            )


class PositionInvarianceTest(chex.TestCase):
    """Without positions and without a mask the model cannot tell token order apart."""

    def _max_permutation_error(self, cfg):
        tokens = _tokens()
        perm_T = jax.random.permutation(jax.random.key(5), DIMS.T)
        params = _params(cfg)
        logits = forward(params, tokens, cfg)
        return float(jnp.abs(forward(params, tokens[:, perm_T], cfg) - logits[:, perm_T]).max())

    def test_bidirectional_model_without_positions_is_equivariant(self):
        self.assertLess(
            self._max_permutation_error(CFG.replace(causal=False, pos_encoding="none")), 1e-5
        )

    @parameterized.named_parameters(("learned", "learned"), ("sinusoidal", "sinusoidal"))
    def test_positions_break_equivariance(self, scheme):
        self.assertGreater(
            self._max_permutation_error(CFG.replace(causal=False, pos_encoding=scheme)), 1e-3
        )


class CausalityTest(chex.TestCase):
    @parameterized.named_parameters(
        ("learned", "learned"), ("sinusoidal", "sinusoidal"), ("rope", "rope"), ("none", "none")
    )
    def test_editing_position_t_leaves_earlier_logits_unchanged(self, scheme):
        cfg = CFG.replace(pos_encoding=scheme)
        tokens = _tokens()
        logits = forward(_params(cfg), tokens, cfg)
        for t in (0, 3, DIMS.T - 1):
            edited = forward(_params(cfg), tokens.at[:, t].set((tokens[:, t] + 1) % DIMS.V), cfg)
            chex.assert_trees_all_close(edited[:, :t], logits[:, :t], atol=0, rtol=0)
            self.assertGreater(float(jnp.abs(edited[:, t:] - logits[:, t:]).max()), 1e-6)

    def test_gradient_of_early_logits_ignores_later_embeddings(self):
        """nanodo's test: d logits[:, t] / d x[:, s] = 0 for s > t, through the whole model."""
        params, tokens = _params(CFG), _tokens()
        t = 3

        def early_logit_sum(pos_table):
            p = {**params, "embed": {**params["embed"], "pos": {"embedding": pos_table}}}
            return forward(p, tokens, CFG)[:, t].sum()

        grad_TmaxxD = jax.grad(early_logit_sum)(params["embed"]["pos"]["embedding"])
        self.assertEqual(float(jnp.abs(grad_TmaxxD[t + 1 :]).max()), 0.0)
        self.assertGreater(float(jnp.abs(grad_TmaxxD[: t + 1]).min(axis=-1).max()), 0.0)


class TyingTest(chex.TestCase):
    def _untied_twin(self):
        untied = CFG.replace(tie_embeddings=False)
        params = dict(_params(CFG))
        params["lm_head"] = {"kernel": params["embed"]["tok"]["embedding"].T}
        chex.assert_trees_all_equal_shapes(params, init_params(untied, jax.random.key(9)))
        return untied, params

    def test_params_hold_one_vocab_matrix_and_no_head(self):
        params = _params(CFG)
        self.assertNotIn("lm_head", params)
        vocab_mats = [
            x for x in jax.tree_util.tree_leaves(params) if DIMS.V in x.shape and x.ndim == 2
        ]
        self.assertLen(vocab_mats, 1)
        chex.assert_shape(params["embed"]["tok"]["embedding"], DIMS["VD"])
        chex.assert_shape(
            init_params(CFG.replace(tie_embeddings=False), jax.random.key(0))["lm_head"]["kernel"],
            DIMS["DV"],
        )

    def test_tied_logits_equal_h_times_table_transpose(self):
        _, params = self._untied_twin()
        untied = CFG.replace(tie_embeddings=False)
        chex.assert_trees_all_close(
            forward(_params(CFG), _tokens(), CFG),
            forward(params, _tokens(), untied),
            atol=1e-6,
            rtol=1e-6,
        )

    def test_shared_table_gradient_is_the_sum_of_both_uses(self):
        untied, twin = self._untied_twin()
        tokens = _tokens(shape=(2, 9))
        tied_grad = jax.grad(_loss)(_params(CFG), CFG, tokens)["embed"]["tok"]["embedding"]
        twin_grads = jax.grad(_loss)(twin, untied, tokens)
        summed = twin_grads["embed"]["tok"]["embedding"] + twin_grads["lm_head"]["kernel"].T
        chex.assert_trees_all_close(tied_grad, summed, atol=1e-6, rtol=1e-5)
        # Both uses really contribute.
        self.assertGreater(float(jnp.abs(twin_grads["lm_head"]["kernel"]).max()), 1e-4)
        self.assertGreater(float(jnp.abs(twin_grads["embed"]["tok"]["embedding"]).max()), 1e-4)

    def test_gradients_match_param_structure(self):
        grads = jax.grad(_loss)(_params(CFG), CFG, _tokens(shape=(2, 9)))
        chex.assert_trees_all_equal_shapes_and_dtypes(grads, _params(CFG))
        chex.assert_tree_all_finite(grads)


class ParamCountTest(chex.TestCase):
    # configs/gpt2_small.py's model at GPT-2's vocabulary.
    GPT2_SMALL = gpt_config_from(gpt2_small.get_config(), vocab_size=50257)

    def test_gpt2_small(self):
        self.assertEqual(count_params(self.GPT2_SMALL), 124_439_808)

    def test_gpt2_small_token_table_and_untying(self):
        """The table holds 50,257 rows of 768 padded to 50,304 (vocab_multiple=64); the padding
        is counted apart, once per table."""
        shapes = jax.eval_shape(functools.partial(init_params, self.GPT2_SMALL), jax.random.key(0))
        self.assertEqual(shapes["embed"]["tok"]["embedding"].shape, (50_304, 768))
        self.assertEqual(50_257 * 768, 38_597_376)
        self.assertEqual(vocab_padding_params(self.GPT2_SMALL), 47 * 768)
        untied_cfg = self.GPT2_SMALL.replace(tie_embeddings=False)
        self.assertEqual(count_params(untied_cfg) - 124_439_808, 38_597_376)
        self.assertEqual(vocab_padding_params(untied_cfg), 2 * 47 * 768)

    def test_gpt2_small_without_padding(self):
        unpadded = self.GPT2_SMALL.replace(vocab_multiple=1)
        self.assertEqual(count_params(unpadded), 124_439_808)
        self.assertEqual(vocab_padding_params(unpadded), 0)

    def test_count_matches_materialised_params(self):
        leaves = jax.tree_util.tree_leaves(_params(CFG))
        self.assertEqual(count_params(CFG), sum(x.size for x in leaves))
        padded = CFG.replace(vocab_size=CFG.vocab_size - 3, vocab_multiple=8)
        leaves = jax.tree_util.tree_leaves(init_params(padded, jax.random.key(0)))
        self.assertEqual(vocab_padding_params(padded), 3 * padded.n_embd)
        self.assertEqual(count_params(padded) + 3 * padded.n_embd, sum(x.size for x in leaves))

    def test_flops_per_token_agrees_with_xla_cost_analysis(self):
        """A third of the training estimate is the forward pass; XLA counts the compiled forward
        independently (its count adds the elementwise work the estimate leaves out)."""
        cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
        params = init_params(cfg, jax.random.key(0))
        tokens = jnp.zeros((2, cfg.block_size), jnp.int32)
        compiled = jax.jit(functools.partial(forward, cfg=cfg)).lower(params, tokens).compile()
        cost = compiled.cost_analysis()
        xla_flops_per_token = (cost[0] if isinstance(cost, list) else cost)["flops"] / tokens.size
        self.assertBetween(flops_per_token(cfg) / 3 / xla_flops_per_token, 0.85, 1.0)


class BadInputTest(chex.TestCase):
    def test_too_long_for_learned_positions(self):
        with self.assertRaisesRegex(ValueError, "sequence length 17 exceeds block_size 16"):
            forward(_params(CFG), _tokens(shape=(1, 17)), CFG)

    def test_out_of_range_ids_raise_with_the_checked_entry_point(self):
        tokens = _tokens().at[1, 4].set(DIMS.V)
        with self.assertRaisesRegex(ValueError, r"token id 64 at index \(1, 4\)"):
            checked_forward(_params(CFG), tokens, CFG)

    def test_wrong_rank_is_refused(self):
        with self.assertRaises(AssertionError):
            forward(_params(CFG), jnp.zeros((DIMS.T,), jnp.int32), CFG)


class DenseGradTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        ("tied", {}),
        ("untied_rope_no_bias", dict(tie_embeddings=False, pos_encoding="rope", use_bias=False)),
    )
    def test_direct_dense_vjp_equals_autodiff(self, changes):
        """dense_grad='direct' (the hand-written Dense VJP) gives autodiff's logits and grads."""
        cfg = CFG.replace(**changes)
        direct = cfg.replace(dense_grad="direct")
        tokens = _tokens(shape=(2, 9))
        loss_and_grad = self.variant(jax.value_and_grad(_loss), static_argnums=1)
        loss, grads = loss_and_grad(_params(cfg), cfg, tokens)
        direct_loss, direct_grads = loss_and_grad(_params(cfg), direct, tokens)
        chex.assert_trees_all_close(direct_loss, loss, rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_close(direct_grads, grads, rtol=1e-5, atol=1e-7)


def test_cross_entropy_equals_optax_values_and_gradients():
    """The read-out's cross-entropy is optax's softmax_cross_entropy_with_integer_labels
    (values and gradients bit for bit), without its gather whose gradient XLA folds."""
    import optax

    from minigpt_jax.model.gpt import cross_entropy

    logits_ExV = 5 * jax.random.normal(jax.random.key(0), (300, 65))
    targets_E = jax.random.randint(jax.random.key(1), (300,), 0, 65)
    reference = optax.softmax_cross_entropy_with_integer_labels
    np.testing.assert_array_equal(
        cross_entropy(logits_ExV, targets_E), reference(logits_ExV, targets_E)
    )
    grads = [
        jax.grad(lambda x, f=f: f(x, targets_E).mean())(logits_ExV)
        for f in (cross_entropy, reference)
    ]
    np.testing.assert_array_equal(*grads)


# ----------------------------------------------------------------------------- MLP and block seams


def test_swiglu_is_numpy_silu_gate_times_up():
    from minigpt_jax.model.blocks import MLPS

    cfg = CFG.replace(mlp="swiglu", mlp_ratio=8 / 3, mlp_multiple=8)
    module = MLPS["swiglu"](cfg)
    x_BxTxD = jax.random.normal(jax.random.key(0), (2, 5, 32))
    variables = nn.unbox(module.init(jax.random.key(1), x_BxTxD))
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
    assert set(p) == {"gate", "up", "proj"} and p["gate"]["kernel"].shape == (32, 88)
    x = np.asarray(x_BxTxD, np.float64)
    gate = x @ p["gate"]["kernel"] + p["gate"]["bias"]
    up = x @ p["up"]["kernel"] + p["up"]["bias"]
    expected = (gate / (1 + np.exp(-gate)) * up) @ p["proj"]["kernel"] + p["proj"]["bias"]
    np.testing.assert_allclose(module.apply(variables, x_BxTxD), expected, rtol=1e-4, atol=1e-6)


def test_mlp_width_rounding():
    assert CFG.mlp_dim == 4 * 32 and isinstance(CFG.mlp_dim, int)
    assert GPTConfig(n_embd=4096, n_head=32, mlp_ratio=8 / 3, mlp_multiple=256).mlp_dim == 11008
    assert GPTConfig(n_embd=768, n_head=12, mlp_ratio=4).mlp_dim == 3072  # an int still works
    assert CFG.replace(mlp_ratio=8 / 3).mlp_dim == 85  # round(85.33)


def test_parallel_block_is_x_plus_attn_plus_mlp_of_one_norm():
    from minigpt_jax.model.attention import MultiHeadAttention
    from minigpt_jax.model.blocks import BLOCKS, MLP

    cfg = CFG.replace(block="parallel")
    block = BLOCKS["parallel"](cfg)
    x_BxTxD = jax.random.normal(jax.random.key(0), (2, 6, 32))
    positions_1xT = jnp.arange(6)[None]
    variables = nn.unbox(block.init(jax.random.key(1), x_BxTxD, positions_1xT))
    p = variables["params"]
    assert set(p) == {"ln_1", "attn", "mlp"}
    n = nn.LayerNorm(epsilon=1e-5).apply({"params": p["ln_1"]}, x_BxTxD)
    attn, _ = MultiHeadAttention(cfg).apply({"params": p["attn"]}, n, positions_1xT)
    mlp = MLP(cfg).apply({"params": p["mlp"]}, n)
    out, _ = block.apply(variables, x_BxTxD, positions_1xT)
    np.testing.assert_allclose(out, x_BxTxD + attn + mlp, rtol=1e-5, atol=1e-6)


def test_default_metadata_keeps_the_old_path_rules():
    """Decay on kernels and embeddings only; Muon on the blocks' attention and MLP kernels with
    the axes the path rules of optimizers.py gave before the metadata (written out here)."""
    import optax

    from minigpt_jax.muon import muon_dimension_numbers
    from minigpt_jax.optimizers import decay_mask

    dims = optax.contrib.MuonDimensionNumbers
    old_rules = {
        ("attn", "qkv"): dims(reduction_axis=0, output_axis=(2, 3)),
        ("attn", "proj"): dims(reduction_axis=(0, 1), output_axis=2),
        ("mlp", "fc"): dims(reduction_axis=0, output_axis=1),
        ("mlp", "proj"): dims(reduction_axis=0, output_axis=1),
    }
    for cfg in (CFG, CFG.replace(tie_embeddings=False, use_bias=False, norm="rmsnorm")):
        params = init_params(cfg, jax.random.key(0))
        flat_decay = dict(jax.tree_util.tree_flatten_with_path(decay_mask(params))[0])
        flat_muon = jax.tree_util.tree_flatten_with_path(
            muon_dimension_numbers(params), is_leaf=lambda x: x is None or isinstance(x, dims)
        )[0]
        for path, rule in flat_muon:
            names = tuple(k.key for k in path)
            old = None
            if names[-1] == "kernel" and names[0].startswith("block_"):
                old = old_rules.get(names[-3:-1])
            assert rule == old, names
            assert flat_decay[path] == (names[-1] in ("kernel", "embedding")), names
