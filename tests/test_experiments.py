"""Experiments 1-7: each run() reproduces its headline numbers and writes its figures."""

import chex
import jax
import numpy as np
import pytest

from experiments import context, equivariance, lookup, one_step, positions, relabel, tying
from minigpt_jax import GPTConfig, init_params

# One small model for every test: the experiments share its per-op compiles (block_size 64 is
# the mini-GPT's, for the "learned positions refuse 100 tokens" check).
TINY = GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


class _ExperimentTest(chex.TestCase):
    @pytest.fixture(autouse=True)
    def _tmp_path(self, tmp_path):
        # absl's create_tempdir needs parsed flags, which pytest never parses.
        self.tmp_path = tmp_path

    def _run(self, module, **kwargs):
        """run() into a fresh directory; asserts that every figure it reports exists."""
        result = module.run(self.tmp_path / module.__name__.rsplit(".", 1)[-1], **kwargs)
        self.assertNotEmpty(result["figures"])
        for path in result["figures"]:
            self.assertTrue(path.is_file() and path.stat().st_size > 0, path)
        return result


class LookupTest(_ExperimentTest):
    def test_lookup_is_the_one_hot_product_at_a_fraction_of_the_flops(self):
        result = self._run(lookup, sizes=((64, 16), (1024, 16)), tokens=32, repeats=1)
        self.assertEqual(result["shape"], (1, 3, 128))
        self.assertEqual(result["max_abs_diff"], 0.0)
        self.assertEqual(result["rows_max_abs_diff"], 0.0)
        for cost in result["costs"]:
            self.assertEqual(cost["matmul_flops"], 2 * 32 * cost["V"] * 16)
            # XLA counts at least the product's multiply-adds, and far fewer for the gather.
            self.assertGreaterEqual(cost["xla_matmul_flops"], cost["matmul_flops"])
            self.assertLess(cost["xla_gather_flops"], cost["matmul_flops"] / 10)


class RelabelTest(_ExperimentTest):
    def test_relabelling_preserves_lookup_and_an_edit_reaches_exactly_its_occurrences(self):
        result = self._run(relabel, n_embd=16)
        self.assertGreater(result["ids_moved"], 500)
        self.assertEqual(result["relabel_max_abs_diff"], 0.0)
        self.assertEqual(result["changed_positions"], result["occurrences"])
        self.assertLen(result["occurrences"], 5)
        self.assertEqual(result["max_change_elsewhere"], 0.0)
        self.assertEqual(result["max_change_at_occurrences"], result["row_change"])
        self.assertGreater(result["row_change"], 0.0)


class OneStepTest(_ExperimentTest):
    def test_one_step_hits_the_course_numbers_and_moves_only_the_input_row(self):
        result = self._run(one_step)
        self.assertEqual(f"{result['p_before']:.3f}", "0.470")
        self.assertEqual(f"{result['p_after']:.3f}", "0.610")
        self.assertEqual(f"{result['loss_before']:.3f}", "0.755")
        self.assertEqual(f"{result['loss_after']:.3f}", "0.495")
        # The gap grows by lr·(1 - p)·‖w_zamek - w_klucz‖², as measured through jax.grad.
        self.assertAlmostEqual(
            result["gap_after"] - result["gap_before"], result["predicted_gap_change"], delta=1e-6
        )
        self.assertAlmostEqual(result["predicted_gap_change"], 0.4 * 0.53 * 2.67, delta=1e-4)
        # All other rows are bit-identical (run() compares them with np.array_equal).
        self.assertEqual(result["changed_rows"], ["kamienny"])


class ContextTest(_ExperimentTest):
    def test_same_input_at_zamek_different_output_unless_sentences_match(self):
        result = self._run(context)
        self.assertEqual(result["input_diff"], 0.0)
        self.assertGreater(result["output_diff"], 0.05)
        self.assertEqual(result["same_sentence_diff"], 0.0)
        for weights_TxT in result["weights"]:
            np.testing.assert_allclose(weights_TxT.sum(-1), 1.0, atol=1e-6)
            self.assertEqual(float(np.triu(weights_TxT, k=1).max()), 0.0)  # causal
        # "zamek" weighs its context differently in the two sentences.
        self.assertGreater(float(np.abs(result["weights"][0] - result["weights"][1]).max()), 0.01)


class PositionsTest(_ExperimentTest):
    def test_similarity_depends_on_offset_only_and_decays(self):
        result = self._run(positions, length=128, dim=128, cfg=TINY, too_long=100)
        similarity = result["similarity_at_offset"]
        self.assertAlmostEqual(float(similarity[0]), 64.0, delta=1e-4)
        self.assertLess(float(similarity[1:].max()), float(similarity[0]))
        self.assertLess(result["max_diagonal_spread"], 1e-3)  # constant along each diagonal
        self.assertLess(result["max_analytic_diff"], 1e-3)  # = Σ_k cos(offset·ω_k)
        bands = list(result["band_means"].values())
        self.assertLen(bands, 3)
        self.assertEqual(bands, sorted(bands, reverse=True))

    def test_learned_refuses_100_tokens_sinusoidal_accepts_them(self):
        result = self._run(positions, length=16, dim=16, cfg=TINY, too_long=100)
        self.assertEqual(result["accepts"], {"learned": False, "sinusoidal": True})


class EquivarianceTest(_ExperimentTest):
    def test_only_bidirectional_without_positions_is_equivariant(self):
        result = self._run(equivariance, cfg=TINY, length=8, seeds=(0,))
        for (causal, scheme), error in result["full"].items():
            if not causal and scheme == "none":
                self.assertLess(error, 1e-4)
            else:
                self.assertGreater(error, 1e-2, (causal, scheme))
        # Causality: permuting later tokens leaves earlier logits bit-identical.
        self.assertEqual(set(result["prefix"].values()), {0.0})
        # Set of the past: holds for one layer without positions, not for two layers.
        self.assertLess(result["past_set"][("none", 1)], 1e-4)
        self.assertGreater(result["past_set"][("none", 2)], 1e-2)
        for scheme in ("learned", "sinusoidal", "rope"):
            self.assertGreater(result["past_set"][(scheme, 1)], 1e-2, scheme)

    def test_shared_weights_equal_a_fresh_init(self):
        """The experiment derives every scheme's params from one learned init: exactly."""
        cfg = TINY.replace(pos_encoding="rope", causal=False)
        chex.assert_trees_all_equal(
            equivariance.model_params(cfg, 0), init_params(cfg, jax.random.key(0))
        )


class TyingTest(_ExperimentTest):
    def test_counts_gradient_sum_and_rows_changed(self):
        result = self._run(tying, cfg=TINY, batch=4, length=9, id_range=16)
        gpt2 = result["counts"]["GPT-2 small"]
        self.assertEqual(gpt2["table"], 38_597_376)
        self.assertEqual(gpt2["tied"], 124_439_808)
        self.assertEqual(gpt2["untied"] - gpt2["tied"], 38_597_376)
        mini = result["counts"]["mini-GPT"]
        self.assertEqual(mini["table"], 64 * 32)
        self.assertEqual(mini["untied"] - mini["tied"], mini["table"])
        self.assertLess(result["grad_sum_max_abs_diff"], 1e-6)
        present, vocab = result["present_ids"], result["vocab_size"]
        self.assertLess(present, vocab)
        self.assertEqual(
            result["rows_changed"],
            {
                "untied input table, SGD": present,
                "untied lm_head (columns), SGD": vocab,
                "tied table, SGD": vocab,
                "untied input table, AdamW wd=0.1": vocab,
                "untied input table, Adam (wd=0)": present,
            },
        )
