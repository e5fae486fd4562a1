"""Embeddings: lookup = one-hot · W_E, relabelling invariance, positions, id checks."""

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from minigpt_jax import Embeddings, GPTConfig, check_token_ids, sinusoidal_positions

DIMS = chex.Dimensions(B=2, T=8, D=32, V=64)
CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=4, n_embd=32, dropout=0.0)


def _embed(cfg, params, tokens_BxT):
    return Embeddings(cfg).apply({"params": params}, tokens_BxT)


def _init(cfg, seed=0):
    return nn.unbox(
        Embeddings(cfg).init(jax.random.key(seed), jnp.zeros((1, 1), jnp.int32))["params"]
    )


class LookupTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_lookup_equals_one_hot_times_table(self):
        cfg = CFG.replace(pos_encoding="none")
        params = _init(cfg)
        tokens_BxT = jax.random.randint(jax.random.key(1), DIMS["BT"], 0, DIMS.V)
        x_BxTxD = self.variant(lambda t: _embed(cfg, params, t))(tokens_BxT)
        table_VxD = params["tok"]["embedding"]
        one_hot_BxTxV = jax.nn.one_hot(tokens_BxT, DIMS.V)
        chex.assert_shape(x_BxTxD, DIMS["BTD"])
        chex.assert_trees_all_close(
            x_BxTxD, jnp.einsum("btv,vd->btd", one_hot_BxTxV, table_VxD), rtol=1e-6, atol=1e-6
        )

    def test_embed_scale_multiplies_the_looked_up_rows(self):
        cfg = CFG.replace(pos_encoding="none", embed_scale=math.sqrt(CFG.n_embd))
        params = _init(cfg)
        tokens_BxT = jax.random.randint(jax.random.key(1), DIMS["BT"], 0, DIMS.V)
        chex.assert_trees_all_close(
            _embed(cfg, params, tokens_BxT),
            params["tok"]["embedding"][tokens_BxT] * math.sqrt(DIMS.D),
            rtol=1e-6,
            atol=1e-6,
        )

    def test_repeated_id_gives_the_same_vector(self):
        cfg = CFG.replace(pos_encoding="none")
        x_1xTxD = _embed(cfg, _init(cfg), jnp.array([[5, 9, 5, 5]]))
        chex.assert_trees_all_equal(x_1xTxD[0, 0], x_1xTxD[0, 2], x_1xTxD[0, 3])
        self.assertFalse(np.allclose(x_1xTxD[0, 0], x_1xTxD[0, 1]))

    @chex.variants(with_jit=True, without_jit=True)
    def test_course_example_shape(self):
        cfg = GPTConfig()  # V=512, D=128
        params = _init(cfg)
        x = self.variant(lambda t: _embed(cfg, params, t))(jnp.array([[76, 299, 412]]))
        chex.assert_shape(x, (1, 3, 128))
        chex.assert_tree_all_finite(x)

    def test_param_paths_and_shapes(self):
        params = _init(CFG)
        chex.assert_shape(params["tok"]["embedding"], (CFG.vocab_size, CFG.n_embd))
        chex.assert_shape(params["pos"]["embedding"], (CFG.block_size, CFG.n_embd))
        for scheme in ("sinusoidal", "rope", "none"):
            self.assertEqual(set(_init(CFG.replace(pos_encoding=scheme))), {"tok"})

    @parameterized.named_parameters(("learned", "learned"), ("sinusoidal", "sinusoidal"))
    def test_relabelling_ids_with_rows_permuted_changes_nothing(self, scheme):
        """Ids renamed by π and rows moved to match: embedding(π(ids)) with W'[π(i)] = W[i]."""
        cfg = CFG.replace(pos_encoding=scheme)
        params = _init(cfg)
        perm_V = jax.random.permutation(jax.random.key(2), DIMS.V)
        tokens_BxT = jax.random.randint(jax.random.key(3), DIMS["BT"], 0, DIMS.V)
        table_VxD = params["tok"]["embedding"]
        permuted = {
            **params,
            "tok": {"embedding": jnp.zeros_like(table_VxD).at[perm_V].set(table_VxD)},
        }
        chex.assert_trees_all_close(
            _embed(cfg, permuted, perm_V[tokens_BxT]),
            _embed(cfg, params, tokens_BxT),
            rtol=0,
            atol=0,
        )

    def test_editing_one_row_changes_only_its_occurrences(self):
        cfg = CFG.replace(pos_encoding="none")
        params = _init(cfg)
        tokens_1xT = jnp.array([[3, 7, 3, 1, 7, 3]])
        edited = {"tok": {"embedding": params["tok"]["embedding"].at[3].add(1.0)}}
        changed_T = jnp.any(_embed(cfg, edited, tokens_1xT) != _embed(cfg, params, tokens_1xT), -1)[
            0
        ]
        np.testing.assert_array_equal(changed_T, tokens_1xT[0] == 3)


class SinusoidalTest(chex.TestCase):
    def test_values_match_the_formula_at_hand_computed_points(self):
        table = np.asarray(sinusoidal_positions(8, 4))
        chex.assert_shape(table, (8, 4))
        # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), d = 4.
        np.testing.assert_allclose(table[0], [0.0, 1.0, 0.0, 1.0], atol=1e-7)
        np.testing.assert_allclose(table[1, :2], [math.sin(1.0), math.cos(1.0)], atol=1e-6)
        np.testing.assert_allclose(table[2, 2:], [math.sin(0.02), math.cos(0.02)], atol=1e-6)
        np.testing.assert_allclose(table[7, 2], math.sin(7 / 100.0), atol=1e-6)

    def test_every_pair_is_a_unit_circle_point(self):
        table = np.asarray(sinusoidal_positions(50, 16))
        np.testing.assert_allclose(table[:, 0::2] ** 2 + table[:, 1::2] ** 2, 1.0, atol=1e-5)

    def test_odd_dim_is_refused(self):
        with self.assertRaisesRegex(ValueError, "even dim"):
            sinusoidal_positions(4, 5)


class PositionLengthTest(chex.TestCase):
    def test_learned_positions_refuse_sequences_longer_than_block_size(self):
        cfg = GPTConfig()
        with self.assertRaisesRegex(ValueError, "sequence length 100 exceeds block_size 64"):
            _embed(cfg, _init(cfg), jnp.zeros((1, 100), jnp.int32))

    @parameterized.named_parameters(("sinusoidal", "sinusoidal"), ("none", "none"))
    def test_fixed_positions_accept_longer_sequences(self, scheme):
        cfg = GPTConfig(pos_encoding=scheme)
        x = _embed(cfg, _init(cfg), jnp.zeros((1, 100), jnp.int32))
        chex.assert_shape(x, (1, 100, 128))


class TokenIdCheckTest(chex.TestCase):
    def test_out_of_range_id_is_named(self):
        with self.assertRaisesRegex(ValueError, r"token id 64 at index \(0, 2\) is outside"):
            check_token_ids(np.array([[1, 2, 64, 3]]), 64)
        with self.assertRaisesRegex(ValueError, "token id -1"):
            check_token_ids(np.array([[-1]]), 64)

    def test_float_ids_are_refused(self):
        with self.assertRaisesRegex(TypeError, "integer dtype"):
            check_token_ids(np.array([[1.0]]), 64)
        with self.assertRaises(AssertionError):  # chex.assert_type at the module boundary
            _embed(CFG, _init(CFG), jnp.zeros((1, 3), jnp.float32))

    def test_in_range_ids_pass(self):
        check_token_ids(np.arange(64)[None], 64)
