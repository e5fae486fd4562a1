"""Experiments 1-10: each run() reproduces its headline numbers (8-10: the properties behind
them, on tiny runs) and writes its figures."""

import math
from pathlib import Path

import chex
import jax
import numpy as np
import pytest
from helpers import pydoc_text

from configs import tiny
from experiments import (
    context,
    equivariance,
    geometry,
    lookup,
    one_step,
    pos_study,
    positions,
    relabel,
    tied_vs_untied,
    tying,
)
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


# ----------------------------------------------------------------------------- training studies

# Experiments 8-10 train for real; here on ~40 kB of CPython's docs (no download) with the
# tiny config's sizes and one layer, so a run is mostly its compile.
TRAIN_STEPS = 30


def _training_config(directory: Path):
    """configs/tiny.py (one layer) on a small text corpus written into `directory`."""

    corpus = directory / "corpus.txt"
    corpus.write_text(pydoc_text())
    config = tiny.get_config()
    config.model.n_layer = 1
    config.data.corpus = "text"
    config.data.path = str(corpus)
    return config


@pytest.fixture(scope="module")
def pos_study_result(tmp_path_factory):
    """Experiment 8 once per module; geometry reuses its learned-positions run (the default)."""
    directory = tmp_path_factory.mktemp("pos_study")
    config = _training_config(directory)
    return pos_study.run(directory, steps=TRAIN_STEPS, config=config, windows=8)


class PosStudyTest(_ExperimentTest):
    @pytest.fixture(autouse=True)
    def _result(self, pos_study_result):
        self.result = pos_study_result

    def test_every_scheme_learns_and_only_learned_refuses_long_context(self):
        result = self.result
        self.assertTrue(result["figures"][0].is_file())
        block, log_vocab = result["block_size"], math.log(result["vocab_size"])
        self.assertEqual(block, 16)
        self.assertLess(result["unigram_loss"], log_vocab)
        for scheme in pos_study.SCHEMES:
            steps, losses = result["curves"][scheme]
            self.assertEqual(steps[-1], TRAIN_STEPS)
            self.assertLen(steps, 10)
            self.assertLess(losses[-1], losses[0])
            val_loss = result["final_val_loss"][scheme]
            self.assertEqual(val_loss, losses[-1])
            self.assertLess(val_loss, log_vocab - 0.5, scheme)
            self.assertGreater(result["token_norm"][scheme], 0.0)
            long = result["long_loss"][scheme]
            # The study's own evaluation at block_size agrees with the trainer's (other windows).
            self.assertAlmostEqual(long[1], val_loss, delta=0.2)
            if scheme == "learned":
                for multiple in (2, 4):
                    self.assertIn(f"exceeds block_size {block}", long[multiple])
                self.assertIsNone(result["beyond_block"][scheme])
                self.assertEqual(set(result["per_position"][scheme]), {1})
                continue
            for multiple in (2, 4):
                self.assertTrue(math.isfinite(long[multiple]), (scheme, multiple))
            self.assertTrue(math.isfinite(result["beyond_block"][scheme]))

    def test_sinusoids_are_trained_with_the_papers_scale_and_the_unscaled_lesson_beside(self):
        """Only "sinusoidal" scales its tokens by sqrt(D), so its token vectors, as the positions
        meet them, are far louder than the unscaled run's; the other schemes are unscaled."""
        norms = self.result["token_norm"]
        self.assertEqual(set(norms), set(pos_study.VARIANTS))
        self.assertGreater(norms["sinusoidal"], 3 * norms[pos_study.UNSCALED])
        self.assertEqual(
            pos_study.variant_model("sinusoidal", 64),
            dict(pos_encoding="sinusoidal", embed_scale=8.0),
        )
        for scheme in ("learned", "rope", "none", pos_study.UNSCALED):
            self.assertEqual(pos_study.variant_model(scheme, 64)["embed_scale"], 1.0)

    def test_long_windows_extend_the_short_ones(self):
        """Causal model, same windows: the first block_size positions of the 4x windows give
        the 1x losses, so the lengths differ only in what comes after."""
        block = self.result["block_size"]
        for scheme in ("sinusoidal", "rope", "none"):
            per_position = self.result["per_position"][scheme]
            self.assertEqual(per_position[4].shape, (4 * block,))
            np.testing.assert_allclose(per_position[4][:block], per_position[1], atol=1e-4)
            np.testing.assert_allclose(per_position[4][: 2 * block], per_position[2], atol=1e-4)


class TiedVsUntiedTest(_ExperimentTest):
    def test_untying_adds_exactly_v_times_d_and_both_learn(self):
        config = _training_config(self.tmp_path)
        result = self._run(tied_vs_untied, steps=TRAIN_STEPS, config=config, widths=(32,))
        tied, untied = result["runs"]
        vocab = result["vocab_size"]
        self.assertEqual((tied["tied"], untied["tied"]), (True, False))
        self.assertEqual(untied["params"], tied["params"] + vocab * 32)
        self.assertEqual((tied["has_lm_head"], untied["has_lm_head"]), (False, True))
        for run in (tied, untied):
            self.assertLess(run["val_loss"], math.log(vocab) - 0.5, run["name"])
            self.assertEqual(run["curve"][1][-1], run["val_loss"])
        self.assertEqual(result["deltas"], {32: [untied["val_loss"] - tied["val_loss"]]})


@pytest.fixture(scope="module")
def geometry_result(pos_study_result, tmp_path_factory):
    """Experiment 10 on the pos study's learned-positions run (the default config), reused."""
    workdir = pos_study_result["figures"][0].parent / "runs" / "pos_learned"
    return geometry.run(tmp_path_factory.mktemp("geometry"), workdir=workdir)


class GeometryTest(_ExperimentTest):
    @pytest.fixture(autouse=True)
    def _result(self, geometry_result):
        self.result = geometry_result

    def test_reuses_the_trained_run(self):
        self.assertFalse(self.result["trained_here"])
        self.assertEqual(self.result["step"], TRAIN_STEPS)
        self.assertTrue(self.result["figures"][0].is_file())

    def test_neighbour_lists_have_k_entries_exclude_the_query_and_are_sorted(self):
        result = self.result
        for neighbours in (result["neighbours"], result["init_neighbours"]):
            # The docs contain every default query, digits included.
            self.assertEqual(set(neighbours), set(geometry.QUERIES))
            for query, pairs in neighbours.items():
                self.assertLen(pairs, 5)
                labels = [label for label, _ in pairs]
                self.assertNotIn(query, labels)
                self.assertLen(set(labels), 5)
                cosines = [c for _, c in pairs]
                self.assertEqual(cosines, sorted(cosines, reverse=True))
                self.assertTrue(all(-1.0 <= c <= 1.0 for c in cosines))

    def test_group_statistics_are_finite_and_the_initial_table_has_no_structure(self):
        result = self.result
        self.assertEqual(
            set(result["groups"]), {"vowels", "consonants", "upper case", "punctuation", "digits"}
        )
        self.assertEqual(result["groups"]["vowels"], list("aeiou"))
        self.assertEqual(
            set(result["stats"]), {"trained", "init", "trained, centred", "init, centred"}
        )
        for stats in result["stats"].values():
            values = [*stats["within"].values()]
            values += [stats[k] for k in ("within_all", "between", "case_pair", "case_other")]
            self.assertTrue(all(math.isfinite(v) and -1 <= v <= 1 for v in values))
            self.assertTrue(0 <= stats["nn_same_group"] <= 1)
        # Control: random N(0, 0.02²) rows are nearly orthogonal, whatever group they name.
        for name in ("init", "init, centred"):
            init = result["stats"][name]
            self.assertLess(abs(init["within_all"] - init["between"]), 0.05)
            self.assertLess(abs(init["case_pair"] - init["case_other"]), 0.1)
        # Training moved the table away from that (rows share directions now).
        trained = result["stats"]["trained"]
        self.assertGreater(trained["within_all"] - trained["between"], 0.05)
        for value in result["pc1_frequency_corr"].values():
            self.assertTrue(0 <= value <= 1)
