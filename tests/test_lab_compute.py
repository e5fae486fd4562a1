"""The lab's numbers: the article's figures, and the properties each part of the page shows."""

import math
import re

import chex
import numpy as np
from absl.testing import parameterized

from minigpt_apps.lab import compute
from minigpt_apps.lab.compute import LabInputError
from minigpt_apps.lab.text import TEXT, message

KAMIENNY = compute.VOCAB.index("kamienny")


class StepTest(chex.TestCase):
    def test_the_article_figures_at_the_default_learning_rate(self):
        step = compute.sgd_step(
            compute.TABLE_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY, compute.LEARNING_RATE
        )
        # The article: p(zamek) 47.0% -> 61.0%, loss 0.755 -> 0.495.
        self.assertEqual(f"{step.p_before:.3f}", "0.470")
        self.assertEqual(f"{step.p_after:.3f}", "0.610")
        self.assertEqual(f"{step.loss_before:.3f}", "0.755")
        self.assertEqual(f"{step.loss_after:.3f}", "0.495")
        self.assertEqual(f"{100 * step.p_after:.1f}%", "61.0%")
        self.assertEqual(step.changed_rows, [KAMIENNY])

    def test_the_gradient_is_minus_one_minus_p_times_delta_w_on_the_input_row_only(self):
        step = compute.sgd_step(compute.TABLE_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY, 0.4)
        # g = e·Δw = -0.12 by construction of the table; p = σ(g).
        delta_w = np.array([1.3, -0.7, 0.7, 0.0, 0.0, 0.0])
        p = 1 / (1 + math.exp(0.12))
        expected_VxD = np.zeros((6, 6))
        expected_VxD[KAMIENNY] = -(1 - p) * delta_w
        np.testing.assert_allclose(step.grad_VxD, expected_VxD, atol=1e-6)
        self.assertAlmostEqual(step.gap_before, -0.12, places=5)
        self.assertAlmostEqual(step.gap_after - step.gap_before, 0.4 * (1 - p) * 2.67, places=5)
        others = [i for i in range(6) if i != KAMIENNY]
        np.testing.assert_array_equal(step.table_VxD[others], compute.TABLE_VxD[others])

    def test_repeated_steps_keep_raising_p(self):
        table_VxD, ps = compute.TABLE_VxD, []
        for _ in range(3):
            step = compute.sgd_step(table_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY, 0.4)
            table_VxD = step.table_VxD
            ps.append(step.p_after)
        self.assertEqual(ps, sorted(ps))
        self.assertGreater(ps[-1], 0.7)


class LookupRenameEditTest(chex.TestCase):
    def test_lookup_reads_rows_and_equals_the_one_hot_product(self):
        ids_T = np.array([0, 1, 0], np.int32)
        x_TxD = np.asarray(compute.lookup(compute.TABLE_VxD, ids_T[None]))[0]
        np.testing.assert_array_equal(x_TxD, compute.TABLE_VxD[[0, 1, 0]])
        np.testing.assert_array_equal(x_TxD[0], x_TxD[2])
        via_one_hot = np.asarray(compute.one_hot_lookup(compute.TABLE_VxD, ids_T[None]))[0]
        np.testing.assert_array_equal(via_one_hot, x_TxD)

    def test_renaming_ids_and_rows_together_changes_nothing_one_side_alone_does(self):
        ids_T = np.array([0, 1, 2, 1], np.int32)
        perm_V = np.array([5, 3, 0, 1, 2, 4])
        both = compute.rename(compute.TABLE_VxD, ids_T, perm_V)
        self.assertEqual(both.max_abs_diff, 0.0)
        np.testing.assert_array_equal(both.renamed_ids_T, [5, 3, 0, 3])
        for ids, rows in ((True, False), (False, True)):
            one_side = compute.rename(compute.TABLE_VxD, ids_T, perm_V, ids=ids, rows=rows)
            self.assertGreater(one_side.max_abs_diff, 0.1)
        vocab = compute.rename_vocab(compute.VOCAB, perm_V)
        self.assertEqual(vocab.index("kamienny"), 3)
        np.testing.assert_array_equal(both.renamed_table_VxD[3], compute.TABLE_VxD[KAMIENNY])

    def test_editing_a_coordinate_changes_exactly_the_occurrences(self):
        ids_T = np.array([0, 1, 2, 1], np.int32)
        edited_VxD = compute.set_coordinate(compute.TABLE_VxD, KAMIENNY, 3, 0.9)
        self.assertEqual(compute.TABLE_VxD[KAMIENNY, 3], np.float32(0.5))  # the original is kept
        before = compute.lookup(compute.TABLE_VxD, ids_T[None])
        after = compute.lookup(edited_VxD, ids_T[None])
        self.assertEqual(compute.changed_positions(before[0], after[0]), [1, 3])


class ContextTest(chex.TestCase):
    def test_same_input_at_zamek_different_output_until_the_sentences_are_equal(self):
        ids_a = compute.parse_sentence(compute.SENTENCES[0], compute.VOCAB)
        ids_b = compute.parse_sentence(compute.SENTENCES[1], compute.VOCAB)
        head_a = compute.one_head(compute.TABLE_VxD, ids_a)
        head_b = compute.one_head(compute.TABLE_VxD, ids_b)
        np.testing.assert_array_equal(head_a.inputs_TxD[2], head_b.inputs_TxD[2])
        self.assertGreater(np.abs(head_a.outputs_TxD[2] - head_b.outputs_TxD[2]).max(), 0.01)
        again = compute.one_head(compute.TABLE_VxD, ids_a)
        np.testing.assert_array_equal(again.outputs_TxD, head_a.outputs_TxD)
        # Causal: no weight on later words; each query's weights sum to one.
        np.testing.assert_array_equal(np.triu(head_a.weights_TxT, 1), 0.0)
        np.testing.assert_allclose(head_a.weights_TxT.sum(-1), 1.0, atol=1e-6)


class PositionsTest(chex.TestCase):
    def test_a_pair_is_sin_and_cos_at_its_own_rate(self):
        pair = compute.position_pair(5, 1, 16)
        omega = 10000 ** (-2 / 16)
        self.assertAlmostEqual(pair.omega, omega, places=7)
        self.assertAlmostEqual(pair.sin, math.sin(5 * omega), places=5)
        self.assertAlmostEqual(pair.cos, math.cos(5 * omega), places=5)
        self.assertAlmostEqual(pair.period, 2 * math.pi / omega, places=4)

    def test_similarity_depends_on_the_offset_only(self):
        similarity_TxT = compute.position_similarity(32, 16)
        self.assertAlmostEqual(float(similarity_TxT[0, 0]), 8.0, places=4)  # D/2 pairs of sin²+cos²
        for k in (1, 5, 20):
            np.testing.assert_allclose(
                np.diagonal(similarity_TxT, k), similarity_TxT[0, k], atol=1e-4
            )


class ParseTest(chex.TestCase):
    def test_lists_of_ids_in_the_usual_spellings(self):
        for text in ("[0, 1, 0]", "0, 1, 0", "0 1 0", " [0,1,0] "):
            np.testing.assert_array_equal(compute.parse_ids(text, 6), [0, 1, 0])
        np.testing.assert_array_equal(
            compute.parse_permutation("[5, 3, 0, 1, 2, 4]", 6), [5, 3, 0, 1, 2, 4]
        )
        # Rounded to the float32 that the table holds.
        self.assertEqual(compute.parse_number(" 0.4 ", field="learning_rate"), np.float32(0.4))

    @parameterized.named_parameters(
        (
            "out_of_range",
            lambda: compute.parse_ids("[0, 9]", 6),
            "id_out_of_range",
            "id 9 is out of range",
        ),
        ("negative", lambda: compute.parse_ids("[-1]", 6), "id_out_of_range", "rows 0 to 5"),
        ("text", lambda: compute.parse_ids("[0, a]", 6), "not_an_id", "“a” is not a whole number"),
        ("float", lambda: compute.parse_ids("[1.5]", 6), "not_an_id", "“1.5”"),
        ("unclosed", lambda: compute.parse_ids("[0, 1", 6), "malformed_list", "not a list"),
        ("nested", lambda: compute.parse_ids("[[0], 1]", 6), "malformed_list", "not a list"),
        ("double_comma", lambda: compute.parse_ids("0,,1", 6), "malformed_list", "not a list"),
        ("empty", lambda: compute.parse_ids("[]", 6), "empty_list", "the list is empty"),
        (
            "short_perm",
            lambda: compute.parse_permutation("[1, 0]", 6),
            "permutation_length",
            "got 2",
        ),
        (
            "repeat_perm",
            lambda: compute.parse_permutation("[0, 0, 1, 2, 3, 4]", 6),
            "permutation_repeat",
            "id 0 appears twice and 5 is missing",
        ),
        (
            "lr_text",
            lambda: compute.parse_number("abc", field="learning_rate"),
            "not_a_number",
            "learning rate: “abc” is not a number",
        ),
        (
            "lr_inf",
            lambda: compute.parse_number("inf", field="learning_rate"),
            "not_finite",
            "inf is not a finite number",
        ),
        (
            "lr_nan",
            lambda: compute.parse_number("nan", field="learning_rate"),
            "not_finite",
            "nan is not a finite number",
        ),
        (
            "row",
            lambda: compute.parse_int("7", field="row", low=0, high=5),
            "out_of_bounds",
            "row: 7 is out of range",
        ),
        (
            "perm_example",
            lambda: compute.parse_permutation("[0, x, 1, 2, 3, 4]", 6),
            "not_an_id",
            "e.g. [5, 0, 1, 2, 3, 4]",  # a permutation, not [0, 1, 0]
        ),
        (
            "underscore",
            lambda: compute.parse_number("1_000", field="value"),
            "not_a_number",
            "1_000",
        ),
        ("full_width", lambda: compute.parse_number("３", field="value"), "not_a_number", "３"),
        ("arabic_indic", lambda: compute.parse_ids("[٣]", 6), "not_an_id", "٣"),
        (
            "arabic_int",
            lambda: compute.parse_int("٣", field="row", low=0, high=5),
            "not_an_integer",
            "٣",
        ),
        (
            "word",
            lambda: compute.parse_sentence("oto zielony zamek", compute.VOCAB),
            "unknown_word",
            "“zielony” is not in the vocabulary",
        ),
    )
    def test_bad_input_names_the_problem_and_the_fix(self, parse, key, words):
        with self.assertRaises(LabInputError) as caught:
            parse()
        self.assertEqual(caught.exception.key, key)
        self.assertIn(words, str(caught.exception))
        self.assertNotEqual(caught.exception.localized("es"), str(caught.exception))

    def test_zero_padded_ids_are_the_ids_they_spell(self):
        np.testing.assert_array_equal(compute.parse_ids("[00000000000000000000, 01]", 6), [0, 1])
        self.assertEqual(compute.parse_int("0000000000000003", field="row", low=0, high=5), 3)
        with self.assertRaises(LabInputError):  # 13 significant digits are still too many
            compute.parse_ids("[0001000000000000]", 6)

    def test_lists_are_written_with_one_space_after_each_comma(self):
        self.assertEqual(compute.format_ids(np.array([5, 3, 0])), "[5, 3, 0]")

    def test_both_languages_have_every_word(self):
        self.assertEqual(set(TEXT["en"]), set(TEXT["es"]))
        self.assertIn(
            "tasa de aprendizaje", message("es", "not_a_number", field="learning_rate", text="x")
        )


class LabTwoTest(chex.TestCase):
    """The functions behind the second version of the lab: limits, runs of steps, the token map."""

    def test_numbers_are_checked_in_float32_with_a_decimal_comma_in_spanish(self):
        comma = compute.parse_number("0,4", field="step_lr", decimal_comma=True)
        self.assertEqual(comma, float(np.float32(0.4)))
        with self.assertRaises(LabInputError) as caught:
            compute.parse_number("0,4", field="step_lr")
        self.assertEqual(caught.exception.key, "not_a_number_comma")
        for text in ("1e39", "-3.5e38"):  # finite in float64, not in float32
            with self.assertRaises(LabInputError) as caught:
                compute.parse_number(text, field="step_lr")
            self.assertEqual(caught.exception.key, "not_finite")
        with self.assertRaises(LabInputError) as caught:
            compute.parse_number("20", field="step_lr", low=-10, high=10)
        self.assertIn("use -10 to 10", str(caught.exception))

    def test_limits_name_themselves(self):
        cases = (
            (lambda: compute.parse_ids(f"[{2**70}]", 6), "id_out_of_range"),
            (lambda: compute.parse_ids(", ".join(["1"] * 65), 6), "too_many_ids"),
            (lambda: compute.parse_ids(" ".join(["0"] * 100_000), 6), "too_long"),
            (
                lambda: compute.parse_sentence(" ".join(["oto"] * 33), compute.VOCAB),
                "too_many_words",
            ),
            (lambda: compute.parse_int("9" * 5000, field="row", low=0, high=5), "too_long"),
            (lambda: compute.parse_int("9" * 50, field="row", low=0, high=5), "out_of_bounds"),
        )
        for parse, key in cases:
            with self.assertRaises(LabInputError) as caught:
                parse()
            self.assertEqual(caught.exception.key, key)
            self.assertLess(len(str(caught.exception)), 200)  # the input is quoted short
        np.testing.assert_array_equal(compute.parse_ids(", ".join(["1"] * 64), 6), [1] * 64)

    def test_a_run_of_steps_is_the_single_step_repeated(self):
        run = compute.train_steps(compute.TABLE_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY, 0.4, 3)
        table_VxD = compute.TABLE_VxD
        for k in range(3):
            step = compute.sgd_step(table_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY, 0.4)
            self.assertAlmostEqual(run.p_Q1[k], step.p_before, places=6)
            self.assertAlmostEqual(run.loss_Q1[k + 1], step.loss_after, places=6)
            table_VxD = step.table_VxD
        np.testing.assert_allclose(run.table_VxD, table_VxD, atol=1e-7)
        self.assertEqual(f"{100 * run.p_Q1[1]:.1f}%", "61.0%")
        stats = compute.step_stats(compute.TABLE_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY)
        self.assertEqual((f"{stats.p:.3f}", f"{stats.loss:.3f}"), ("0.470", "0.755"))
        self.assertAlmostEqual(stats.gap, -0.12, places=5)
        grad_VxD = compute.step_gradient(compute.TABLE_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY)
        self.assertEqual(np.flatnonzero(np.abs(grad_VxD).max(1)).tolist(), [KAMIENNY])

    def test_the_table_after_a_run_reports_the_runs_last_p_exactly(self):
        # The chart adds a "now" point when it differs from the run's last one (issue 39, defect 9).
        run = compute.train_steps(compute.TABLE_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY, 0.4, 1)
        stats = compute.step_stats(run.table_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY)
        self.assertEqual((stats.p, stats.loss), (float(run.p_Q1[-1]), float(run.loss_Q1[-1])))

    def test_a_run_that_leaves_float32_is_refused(self):
        huge_VxD = compute.set_coordinate(compute.TABLE_VxD, KAMIENNY, 0, -3e38)
        with self.assertRaises(LabInputError) as caught:
            compute.train_steps(huge_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY, 1e38, 2)
        self.assertEqual(caught.exception.key, "table_not_finite")
        with self.assertRaises(LabInputError):
            compute.check_finite(np.array([[np.inf]]))

    def test_the_token_map_has_fixed_axes_and_cosines(self):
        start = compute.token_map(compute.TABLE_VxD)
        self.assertEqual(start.points_Vx2.shape, (6, 2))
        np.testing.assert_allclose(start.points_Vx2.mean(0), 0.0, atol=1e-6)  # centred
        np.testing.assert_allclose(np.diagonal(start.cosine_VxV), 1.0, atol=1e-6)
        np.testing.assert_allclose(start.cosine_VxV, start.cosine_VxV.T, atol=1e-7)
        unit_VxD = compute.TABLE_VxD / np.linalg.norm(compute.TABLE_VxD, axis=1, keepdims=True)
        np.testing.assert_allclose(start.cosine_VxV, unit_VxD @ unit_VxD.T, atol=1e-6)
        # Editing one row moves only that row's point (the axes stay the article's).
        edited = compute.token_map(compute.set_coordinate(compute.TABLE_VxD, KAMIENNY, 0, 2.0))
        moved = np.abs(edited.points_Vx2 - start.points_Vx2).max(1)
        self.assertEqual(np.flatnonzero(moved > 1e-6).tolist(), [KAMIENNY])
        zero = compute.token_map(np.zeros((6, 6), np.float32))
        self.assertTrue(np.isfinite(zero.cosine_VxV).all())

    def test_the_one_hot_matrix_picks_the_rows(self):
        ids_T = np.array([2, 0, 2], np.int32)
        one_hot_TxV = compute.one_hot(ids_T, 6)
        np.testing.assert_array_equal(one_hot_TxV.sum(1), 1.0)
        np.testing.assert_array_equal(one_hot_TxV.argmax(1), ids_T)
        np.testing.assert_array_equal(one_hot_TxV @ compute.TABLE_VxD, compute.TABLE_VxD[ids_T])


class SliderTest(chex.TestCase):
    def test_a_slider_event_that_repeats_the_value_leaves_the_message_alone(self):
        # The drag's last input event repeats the value just applied: the note of the change
        # ("-0.200 → +0.810") must stay, so that event writes no message (defect 2).
        from minigpt_apps.lab import actions
        from minigpt_apps.lab.state import initial_state

        state = initial_state()
        fields = {"edit_ids": "1, 2, 1", "edit_row": "1", "edit_dim": "0"}
        old = f"{float(state.table_VxD[1, 0]):.3f}"
        new_state, note, _ = actions.slide_action(state, {**fields, "edit_slider": "0.81"}, "en")
        self.assertIn("+0.810", note)
        repeated = actions.slide_action(new_state, {**fields, "edit_slider": "0.81"}, "en")
        self.assertEqual(repeated, (None, None, {}))
        # A typed value that changes nothing still says so.
        typed = actions.type_value_action(state, {**fields, "edit_value": old}, "en")
        self.assertIn("nothing changed", typed[1])


class SizesTest(chex.TestCase):
    """Part 2's sequence length (issue 39: its field borrowed part 8's name, "positions shown",
    its limit 164 had no reason, and a Spanish page quoted the model's English ValueError)."""

    def _view(self, length: str, lang: str) -> str:
        from minigpt_apps.lab.views import sizes_view

        fields = {"sizes_ids": compute.format_ids(compute.LESSON_IDS), "sizes_length": length}
        return str(sizes_view(None, fields, lang))

    def test_a_length_beyond_block_size_is_said_in_the_pages_language(self):
        page = self._view("100", "es")
        self.assertIn("no cabe", page)
        self.assertNotIn("exceeds block_size", page)  # the model's own (English) words
        self.assertIn("does not fit", self._view("100", "en"))

    def test_the_length_field_has_its_own_name_and_stops_at_twice_block_size(self):
        with self.assertRaises(LabInputError) as raised:
            self._view("129", "es")
        error = raised.exception
        text = message("es", error.key, **error.params)
        self.assertIn("longitud de la secuencia", text)
        self.assertIn("de 1 a 128", text)
        self._view("128", "en")  # twice block_size: shown, refused by the model's check


class CutTextTest(chex.TestCase):
    def test_a_long_field_is_quoted_with_its_length_in_the_pages_language(self):
        """Issue 39, defect 7: the Spanish page said "(400 characters)" in English."""
        with self.assertRaises(LabInputError) as raised:
            compute.parse_ids("x" * 400, 6)
        spanish = raised.exception.localized("es")
        self.assertIn("xxxxxxxxxxxxxxxxxxxxxxxx… (400 caracteres)", spanish)
        self.assertNotIn("characters", spanish)
        self.assertIn("… (400 characters)", raised.exception.localized("en"))


class SentenceTest(chex.TestCase):
    def test_the_articles_sentence_is_read_as_the_vocabulary_holds_it(self):
        """Issue 39, defect 5: «Oto kamienny zamek» was refused as an unknown word."""
        read = compute.read_sentence("«Oto kamienny zamek».", compute.VOCAB)
        self.assertEqual(read, "oto kamienny zamek")
        np.testing.assert_array_equal(
            compute.parse_sentence("«Oto kamienny zamek».", compute.VOCAB), [0, 1, 2]
        )
        with self.assertRaises(LabInputError) as raised:
            compute.parse_sentence("oto drewniany zamek", compute.VOCAB)
        self.assertEqual(raised.exception.key, "unknown_word")


class AppliedGradientTest(chex.TestCase):
    def test_the_gradient_and_the_change_are_labelled_as_what_they_are(self):
        """Issue 39, defect 6: the caption said "times lr" over the raw gradient, and after N
        steps the row "change (−lr × gradient)" held the N-step total."""
        from minigpt_apps.lab.state import LabState
        from minigpt_apps.lab.views import _applied_html

        before_VxD = np.asarray(compute.TABLE_VxD, np.float32)
        after_VxD = before_VxD.copy()
        after_VxD[1] -= 0.05
        grad_VxD = np.zeros_like(before_VxD)
        grad_VxD[1] = 0.01
        state = LabState(after_VxD, compute.VOCAB)
        run = {"grad": grad_VxD, "lr": 1.0, "n": 5, "rows": [1], "before": before_VxD}
        many = _applied_html(state, run, TEXT["en"])
        self.assertIn("change over the 5 steps", many)
        self.assertNotIn("times lr", many)
        one = _applied_html(state, {**run, "n": 1}, TEXT["es"])
        self.assertIn("cambio (−tasa × gradiente)", one)
        self.assertIn("el paso restó la tasa = 1 por él", one)


def _table_cells(page: str, table_id: str) -> list[list[str]]:
    """The <td> texts of each row of the table with id `table_id` in a view's HTML."""
    table = re.search(rf'<table[^>]* id="{table_id}">(.*?)</table>', page).group(1)
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in table.split("</tr>")]
    return [row for row in rows if row]


class ArticleAndLessonTest(chex.TestCase):
    """Issue 39, defects 3 and 4: part 2's sizes and the article's [6, 9, 6] as the documents
    write them."""

    def _view(self, lang: str) -> str:
        """Part 2 as the page shows it: the article's example above the fields, the view below."""
        from minigpt_apps.lab.text import TEXT
        from minigpt_apps.lab.views import article_html, sizes_view

        fields = {"sizes_ids": "[76, 299, 412]", "sizes_length": "100"}
        return article_html(TEXT[lang]) + sizes_view(None, fields, lang)["sizes_result"]

    def test_part_2_says_and_computes_the_lessons_sizes(self):
        """The lesson: V, d = 512, 128 and x = tok_emb(ids) -> (1, 3, 128), no positions;
        V = 50,257 only with d = 768 in the tying count."""
        for lang, vocab in (("en", "50,257"), ("es", "50\u202f257")):
            page = self._view(lang)
            self.assertIn("V, d = 512, 128", page)
            self.assertIn("tok_emb(ids)", page)
            self.assertIn("(1, 3, 128)", page)
            self.assertNotIn("d = 128 and learned", page)
            self.assertNotIn("GPT-2's), d = 128", page)
            self.assertIn(f"{vocab} × 768", page)
        params = compute.lesson_params()["params"]
        table_VxD = np.asarray(params["tok"]["embedding"])
        self.assertEqual(table_VxD.shape, (512, 128))
        page = self._view("en")
        x_TxD = np.array(_table_cells(page, "sizes-real"), float)
        np.testing.assert_allclose(x_TxD, table_VxD[[76, 299, 412], :6], atol=5e-5)
        h0_TxD = np.array(_table_cells(page, "sizes-h0"), float)
        positions_PxD = np.asarray(params["pos"]["embedding"])
        np.testing.assert_allclose(
            h0_TxD, table_VxD[[76, 299, 412], :6] + positions_PxD[:3, :6], atol=5e-5
        )

    def test_the_articles_fragment_has_three_coordinates_and_semicolons(self):
        rows = [["0.2; -0.4; 0.1"], ["0.0; -0.2; 0.3"], ["0.2; -0.4; 0.1"]]
        page = self._view("en")
        self.assertEqual(_table_cells(page, "sizes-article"), rows)
        self.assertIn("the first, the second and again the first of the rows shown", page)
        self.assertIn("shape (3, 3)", page)
        self.assertNotIn("shape (3, 6)", page)
        spanish = _table_cells(self._view("es"), "sizes-fragment")
        self.assertEqual(
            [r for r in spanish if r != ["…"]], [["0,2; -0,4; 0,1"], ["0,0; -0,2; 0,3"]]
        )
        np.testing.assert_allclose(
            compute.fragment_lookup((6, 9, 6)),
            [[0.2, -0.4, 0.1], [0.0, -0.2, 0.3], [0.2, -0.4, 0.1]],
            rtol=1e-6,
        )

    def test_part_1_says_where_the_articles_ids_live(self):
        from minigpt_apps.lab.state import initial_state
        from minigpt_apps.lab.views import lookup_view

        for lang, where in (("en", "shown in part 2"), ("es", "en la parte 2")):
            with self.assertRaises(LabInputError) as raised:
                lookup_view(initial_state(), {"lookup_ids": "[6, 9, 6]"}, lang)
            self.assertIn(where, raised.exception.localized(lang))
        with self.assertRaises(LabInputError) as raised:  # another id past the table: as before
            lookup_view(initial_state(), {"lookup_ids": "[7]"}, "en")
        self.assertEqual(raised.exception.key, "id_out_of_range")


class StepFiguresTest(chex.TestCase):
    def test_the_step_figures_show_the_logits_and_softmax_against_numpy(self):
        """Issue 39, against the article: its step shows the two logits, the softmax,
        p(klucz) and L = −ln p(zamek); the page showed p and the loss only."""
        from minigpt_apps.lab.state import LabState
        from minigpt_apps.lab.views import step_view

        table_VxD = compute.TABLE_VxD.astype(np.float64)
        moved_VxD = table_VxD.copy()
        moved_VxD[KAMIENNY, :3] += [0.5, -0.25, 0.125]
        for table in (table_VxD, moved_VxD):
            logits_2 = compute.OUTPUT_WEIGHTS_2xD.astype(np.float64) @ table[KAMIENNY]
            softmax_2 = np.exp(logits_2) / np.exp(logits_2).sum()
            state = LabState(table.astype(np.float32), compute.VOCAB)
            for lang, point in (("en", "."), ("es", ",")):
                page = step_view(state, {}, lang)["step_result"]
                figures = re.search(r'id="step-figures">(.*?)</table>', page).group(1)
                rows = re.findall(r'<th scope="row">(.*?)</th><td>(.*?)</td>', figures)
                shown = {label: value.replace(point, ".") for label, value in rows}
                self.assertEqual(
                    list(shown)[:2], ["logit_zamek = w_zamek · x", "logit_klucz = w_klucz · x"]
                )
                self.assertAlmostEqual(float(shown["logit_zamek = w_zamek · x"]), logits_2[0], 4)
                self.assertAlmostEqual(float(shown["logit_klucz = w_klucz · x"]), logits_2[1], 4)
                for word, p in zip(("zamek", "klucz"), softmax_2, strict=True):
                    self.assertEqual(
                        shown[f"p({word}) = softmax(logits)_{word}"], f"{100 * p:.1f}%"
                    )
                loss = [v for k, v in shown.items() if k.endswith("= −ln p(zamek)")]
                self.assertEqual(loss, [f"{-np.log(softmax_2[0]):.3f}"])


class NumberFormatTest(chex.TestCase):
    """Issue 39's loose number formats: "−0.0000" under a note saying Δw = 0, "5.441e+04
    positions", `{lr:g}` beside four-decimal tables, lr 1e-46 shown as "0" unexplained, and
    part 8's fields refusing each other's values."""

    def test_a_value_that_rounds_to_zero_prints_without_a_minus(self):
        from minigpt_apps.lab.text import number

        grad_D = compute.step_gradient(compute.TABLE_VxD, compute.OUTPUT_WEIGHTS_2xD, KAMIENNY)
        shown = [number(float(g), "+.4f", "en") for g in grad_D[KAMIENNY, 3:]]
        self.assertEqual(shown, ["+0.0000"] * 3)  # Δw[3:] = 0
        self.assertEqual(number(-4.4e-9, ".3f", "es"), "0,000")
        self.assertEqual(number(-0.5, "+.4f", "en"), "-0.5000")
        self.assertEqual(number(float("-inf"), "+.4f", "en"), "-inf")

    def test_a_long_period_is_a_grouped_whole_number(self):
        from minigpt_apps.lab.views import positions_view

        fields = {
            "positions_dim": "16",
            "positions_pos": "5",
            "positions_pair": "7",
            "positions_length": "64",
        }
        period = 2 * math.pi * 10000 ** (14 / 16)  # 19,869.2
        for lang, text in (("en", "19,869 positions"), ("es", "19\u202f869 posiciones")):
            page = positions_view(None, fields, lang)["positions_result"]
            self.assertIn(text, page)
            self.assertNotIn("e+04", page)
        self.assertEqual(round(period), 19_869)

    def test_the_learning_rate_in_a_caption_is_a_plain_decimal(self):
        from minigpt_apps.lab.state import LabState
        from minigpt_apps.lab.views import _applied_html

        state = LabState(compute.TABLE_VxD, compute.VOCAB)
        run = {"grad": np.zeros((6, 6)), "lr": 1e-5, "n": 1, "rows": [], "before": state.table_VxD}
        self.assertIn("lr = 0.00001 times it", _applied_html(state, run, TEXT["en"]))
        self.assertIn("la tasa = 0,00001 por él", _applied_html(state, run, TEXT["es"]))

    def test_a_learning_rate_that_rounds_to_zero_in_float32_is_refused_saying_so(self):
        with self.assertRaises(LabInputError) as raised:
            compute.parse_number("1e-46", field="step_lr")
        text = raised.exception.localized("en")
        self.assertIn("rounds to 0 in float32", text)
        self.assertIn("1.4e-45", text)
        self.assertIn("1,4e-45", raised.exception.localized("es"))
        self.assertEqual(compute.parse_number("-0", field="step_lr"), 0.0)  # 0 is 0, not refused

    def test_part_8_moves_a_position_or_pair_past_the_others_and_says_so(self):
        from minigpt_apps.lab.views import positions_view

        fields = {
            "positions_dim": "8",
            "positions_pos": "70",
            "positions_pair": "9",
            "positions_length": "64",
        }
        page = positions_view(None, fields, "en")["positions_result"]
        self.assertIn("so position 63 is used", page)
        self.assertIn("so pair 3 is used instead of 9", page)
        sin, cos = np.sin(63 * 10000 ** (-6 / 8)), np.cos(63 * 10000 ** (-6 / 8))
        self.assertIn(f"PE(63, 6) = sin(63·ω) = {sin:+.4f}", page)
        self.assertIn(f"PE(63, 7) = cos(63·ω) = {cos:+.4f}", page)
        spanish = positions_view(None, fields, "es")["positions_result"]
        self.assertIn("se usa la posición 63", spanish)

    def test_part_8_writes_the_moved_position_and_pair_into_their_fields(self):
        """Issue 39: the page said position 63 was used, but the field still showed 70."""
        from minigpt_apps.lab.views import positions_view

        fields = {
            "positions_dim": "8",
            "positions_pos": "70",
            "positions_pair": "9",
            "positions_length": "64",
        }
        shown = positions_view(None, fields, "en")
        self.assertEqual(shown["positions_pos"]["value"], "63")
        self.assertEqual(shown["positions_pair"]["value"], "3")
        in_range = positions_view(
            None, {**fields, "positions_pos": "5", "positions_pair": "1"}, "en"
        )
        self.assertNotIn("positions_pos", in_range)  # a value in range is left as typed
        self.assertNotIn("positions_pair", in_range)


class PageOrderTest(chex.TestCase):
    """Issue 39, against the two documents: the page goes as they do, and every heading and
    message that names a part by number names its place on the page."""

    def _places(self) -> dict[str, int]:
        from minigpt_apps.lab.parts import PARTS

        return {part.name: n for n, part in enumerate(PARTS, 1)}

    def test_the_documents_first_examples_come_before_the_ideas_built_on_them(self):
        """Part 1's lookup, then the article's [6, 9, 6] and the lesson's tok_emb(ids) (the
        sizes part), then renaming, editing, steps and the rest (sizes came last, as part 8)."""
        places = self._places()
        later = ("rename", "edit", "step", "map", "context", "positions")
        self.assertEqual((places["lookup"], places["sizes"]), (1, 2))
        self.assertEqual(sorted(places[name] for name in later), list(range(3, 9)))

    def test_each_heading_and_message_names_a_part_by_its_place(self):
        places = self._places()
        part_word = {"en": "part", "es": "parte"}
        for lang in ("en", "es"):
            words = TEXT[lang]
            for name, place in places.items():
                self.assertTrue(words[f"{name}_heading"].startswith(f"{place}. "), (lang, name))
            mentions = {
                "article_ids_elsewhere": [places["sizes"]],
                "edit_no_effect": [places["step"]],
                "rename_fields_mapped": [places["lookup"], places["edit"]],
                "reset_fields_mapped": [places["lookup"], places["edit"]],
            }
            for key, numbers in mentions.items():
                said = re.findall(
                    rf"{part_word[lang]}s? (\d)(?: (?:and|y) (\d))?", words[key], re.I
                )
                self.assertEqual([int(n) for n in said[0] if n], numbers, (lang, key, words[key]))
            for key, text in words.items():  # no other message names a part by its number
                if key not in mentions and isinstance(text, str):
                    self.assertNotRegex(text, rf"(?i)\b{part_word[lang]}s? \d", (lang, key))
