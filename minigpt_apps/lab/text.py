"""The lab page's words in English and Spanish; `message(lang, key, **params)` formats one.

Numbers are formatted as each language prints them: the Spanish page writes a decimal comma and
the percent sign as the article does (47,0%), in tables, messages, fields and plot axes alike
(`number`, and `Words.f` for a message with numbers in it).
"""

from __future__ import annotations

import numbers
import string

LANGUAGES = ("en", "es")


def number(value, spec: str, lang: str) -> str:
    """format(value, spec) as `lang` prints it: "0,755" and "47,0%" in Spanish, as the article
    writes them; -0.0, and a negative value that rounds to zero (-4e-9 as "-0.0000"), print
    as 0 ("+0.0000" where the spec asks for a sign)."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        value = float(value) + 0.0
    text = format(value, spec)
    mantissa = text.split("e")[0].split("E")[0]
    if text.startswith("-") and "0" in mantissa and not any(d in mantissa for d in "123456789"):
        text = ("+" if "+" in spec else "") + text[1:]
    if lang == "es":
        text = text.replace(".", ",")
    return text


class Cut(str):
    """A field's text cut to its first characters for a message; the length of the whole is
    said in the page's language ("… (400 characters)", "… (400 caracteres)")."""

    def __new__(cls, text: str, length: int):
        cut = super().__new__(cls, text)
        cut.length = length
        return cut


_CHARACTERS = {"en": "characters", "es": "caracteres"}


class _Formatter(string.Formatter):
    def __init__(self, lang: str):
        self.lang = lang

    def format_field(self, value, format_spec):
        if isinstance(value, Cut):
            return f"{str.__str__(value)}… ({value.length} {_CHARACTERS[self.lang]})"
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return number(value, format_spec, self.lang)
        return super().format_field(value, format_spec)


class Words(dict):
    """One language's words by key; `f(key, **params)` formats one with that language's numbers."""

    def __init__(self, lang: str, words: dict[str, str]):
        super().__init__(words)
        self.lang = lang
        self._formatter = _Formatter(lang)

    def f(self, key: str, **params) -> str:
        return self._formatter.format(self[key], **params)

    def num(self, value, spec: str) -> str:
        return number(value, spec, self.lang)


_TEXT: dict[str, dict[str, str]] = {
    "en": {
        # ---- page
        "title": "minigpt-jax embedding lab",
        "intro": (
            "Six tokens, six coordinates each: one embedding table W_E (6×6) shared by every part "
            "of this page. Renaming ids, editing a coordinate and taking a training step all change "
            "that one table, and the later parts read it. Every number here is computed by "
            "minigpt_jax's JAX code (the same functions as `experiments/`)."
        ),
        "table_heading": "The shared table W_E (rows: token ids, columns: coordinates): V × d = 6 × 6 = 36 parameters",
        "error_prefix": "Input error",
        "scroll_hint": "⇆ wider than the screen: scroll sideways for the rest",
        "thousands": ",",
        "aria": [],
        "kept_state": "nothing was changed.",
        "unexpected_error": "Unexpected error ({error}); nothing was changed. Please report it.",
        "storage_fresh": "This is the article's table. Your changes are kept in this browser: a reload brings them back (the tabs of one browser share that copy: the last tab changed is the one kept).",
        "storage_restored": "Your table was restored from this browser's storage ({n} steps taken). “Reset the table” starts over.",
        # ---- 1. lookup
        "lookup_heading": "1. Lookup: a token id reads one row of the table",
        "lookup_ids": "Token ids (a list, e.g. [0, 1, 0])",
        "lookup_button": "Look up",
        "lookup_explain": (
            "**What it shows:** a lookup is a one-hot matrix times the table: row t of one_hot(ids) "
            "has a single 1, in column id_t, so it picks row id_t of W_E. **Try:** repeat an id, "
            "e.g. [2, 2, 2], and change the table below (slider, step); the result follows it. "
            "**Why:** no arithmetic happens on the token itself; its id only says which row to read."
        ),
        "lookup_one_hot_matrix": "one_hot(ids): (T, 6)",
        "lookup_rows": "W_E (rows read highlighted)",
        "lookup_result": "The result x, shape ({t}, {d}): row t is W_E[id_t]",
        "lookup_one_hot": "max |x − one_hot(ids) · W_E| = {diff:g}: the lookup equals the one-hot product.",
        "lookup_repeat": "Id {id} ({word}) repeats at positions {positions}: identical vectors (max difference {diff:g}).",
        "lookup_no_repeat": "No id repeats; type one twice, e.g. [0, 1, 0], to see identical vectors.",
        # ---- 3. rename
        "rename_heading": "3. Rename the ids: ids are only names for rows",
        "rename_ids": "Token ids to look up",
        "rename_perm": "Permutation π (id i becomes π[i]), e.g. [5, 3, 0, 1, 2, 4]",
        "rename_mode": "Rename",
        "mode_both": "ids and rows together",
        "mode_ids": "only the ids",
        "mode_rows": "only the rows",
        "rename_button": "Rename",
        "rename_explain": (
            "**What it shows:** the same lookup before and after renaming by a permutation π. "
            "**Try:** “only the ids” or “only the rows” (a what-if), then both together, which is "
            "applied to the shared table; press Rename again to undo it. **Why:** an id has no "
            "meaning of its own; only the pairing of id and row matters."
        ),
        "rename_preview": "Preview on the current table:",
        "rename_table_after": "W_E after the renaming",
        "rename_will_apply": "Pressing Rename applies this to the shared table.",
        "rename_what_if": "A what-if: pressing Rename leaves the shared table alone.",
        "rename_before": "Before: ids {ids}",
        "rename_after": "After: ids {ids}",
        "rename_same": "max |x_after − x_before| = {diff:g}: the result is unchanged.",
        "rename_changed": "max |x_after − x_before| = {diff:g}: the result changed, because only one side was renamed.",
        "rename_applied": "Applied (max |x_after − x_before| = {diff:g}): the shared table and its vocabulary now use the new ids, “{word}” is id {id}. The fields now hold π's inverse and the renamed ids: press Rename again to undo.",
        "rename_not_applied": "This was a what-if: the shared table is unchanged.",
        "rename_fields_mapped": "Parts 1 and 4 keep their words: their ids were renamed by π too (lookup {lookup}, edit {edit}, row {row}).",
        # ---- 4. edit
        "edit_heading": "4. Edit a coordinate: every occurrence of that token changes, nothing else",
        "edit_explain": (
            "**What it shows:** one number of the table and a lookup that reads it. **Try:** pick a "
            "row and a coordinate, then drag the slider (or type a value and press Set): the "
            "highlighted positions, the occurrences of that id, change live, and so do the other "
            "parts. **Why:** every occurrence of a token reads the same row, so they cannot differ "
            "before attention."
        ),
        "edit_ids": "Token ids to look up",
        "edit_row": "Row (token id)",
        "edit_dim": "Coordinate",
        "edit_slider": "W_E[{row}, {dim}] ({word}): drag to change",
        "edit_value": "Or type a value (|value| ≤ 100)",
        "edit_button": "Set",
        "edit_table": "W_E, the shared table",
        "edit_slider_moved": "The slider showed another cell when that key came: nothing was written. It now shows W_E[{row}, {dim}] = {value:+.3f}.",
        "edit_lookup": "Lookup of {ids} (the occurrences of id {row} highlighted)",
        "edit_occurs": "Id {row} ({word}) occurs at positions {positions}: those rows are W_E[{row}] and move together.",
        "edit_absent": "Id {row} ({word}) does not occur in these ids: editing its row changes none of them.",
        "edit_same": "W_E[{row}, {dim}] already holds {value:+.3f}: nothing changed (id {row} occurs at positions {positions}).",
        "edit_summary": "W_E[{row}, {dim}] ({word}): {old:+.3f} → {new:+.3f}.",
        "edit_changed": "Positions whose vector changed: {positions} (the occurrences of id {row}); every other position: max change {other:g}.",
        "edit_nothing": "Id {row} does not occur in the ids, so no looked-up vector changed.",
        "edit_no_effect": "Note: coordinate {dim} of kamienny does not move p({target}) in part 5, because w_zamek and w_klucz agree there (Δw[{dim}] = 0); try coordinate 0, 1 or 2.",
        # ---- 5. step
        "step_heading": "5. One training step: input “{input}”, target “{target}” (not “{rival}”)",
        "step_explain": (
            "**What it shows:** two frozen output vectors turn the input row into two logits; a "
            "plain SGD step subtracts lr × the gradient (from jax.grad). **Try:** one step (47.0% "
            "→ 61.0%), then 50 and watch the chart; a negative learning rate; an edit between runs. "
            "**Why:** only the row that was read has a gradient, and it points along "
            "w_zamek − w_klucz, so p(zamek) rises and the other rows stay bit-identical."
        ),
        "step_lr": "Learning rate (|lr| ≤ 10)",
        "step_button": "Take a training step",
        "step_n": "N steps (1–500)",
        "step_pace": "Pace: steps a second (0 = as fast as it can, or 1 to 1000)",
        "steps_button": "Take N steps",
        "reset_button": "Reset the table",
        "step_p": "p({target})",
        "step_loss": "loss",
        "step_gap": "gap g = logit_{target} − logit_{rival}",
        "step_logit": "logit_{word} = w_{word} · x",
        "step_softmax": "p({word}) = softmax(logits)_{word}",
        "step_loss_row": "cross-entropy loss L = −ln p({target})",
        "step_before": "before the step",
        "steps_before": "before the {n} steps",
        "step_now": "now",
        "step_none": "No step since the table last changed otherwise: take one to compare.",
        "steps_running": "Training: {done} of {n} steps…",
        "steps_done": "Done: {n} of {n} steps.",
        "step_done": "Done: one step.",
        "steps_stopped": "Stopped after {done} of {n} steps.",
        "stop_button": "Stop",
        "step_lr_zero": "The learning rate is 0: the table did not move, yet the step counts (lr × gradient = 0).",
        "step_chart_alt": "Chart of p({target}) and the loss over {n} points: p({target}) from {first:.3f} to {last:.3f}, loss now {loss:.3f}.",
        "step_grad_applied": "The gradient dloss/dW_E at the table before the step; the step subtracted lr = {lr} times it",
        "steps_grad_applied": "The gradient dloss/dW_E of the first of the {n} steps; each step takes its own at its table and subtracts lr = {lr} times it",
        "step_row_caption": "Row {row} ({word}) before → after the {n} step(s)",
        "step_row_before": "before",
        "step_row_change": "change (−lr × gradient)",
        "steps_row_change": "change over the {n} steps (each step's −lr × gradient, summed)",
        "step_row_after": "after",
        "step_chart": "p(zamek) and loss per step",
        "step_axis": "steps taken",
        "step_count": "Steps taken on this table: {n}.",
        "step_grad": "The gradient dloss/dW_E at the current table (only the row read is non-zero)",
        "step_rows": "Rows changed by the step: {rows}; the other rows are bit-identical.",
        "step_outputs": "Frozen output vectors",
        "step_figures_label": "The step's figures, one column per table",
        "reset_done": "The table is the article's again (ids, rows and steps reset).",
        "reset_fields_mapped": "Parts 1 and 4 keep their words: their ids went back with the table's (lookup {lookup}, edit {edit}, row {row}).",
        # ---- 6. token map
        "map_heading": "6. The token map: the six vectors, moving as the table changes",
        "map_explain": (
            "**What it shows:** each row as a point on the two main directions of the article's "
            "table (PCA; fixed axes, so points move rather than the axes), and the cosine of every "
            "pair of rows. **Try:** take 50 steps and watch kamienny move; drag a coordinate. "
            "**Why:** training moves the rows that were read; the geometry is all a model sees."
        ),
        "map_axis": "axis {k}",
        "map_points": "Each row on the article table's two principal axes",
        "map_cosine": "Cosine similarity of the rows",
        "map_cosine_alt": "Heatmap of the cosine similarity of every pair of the {n} rows (the table beside it lists the values).",
        # ---- 7. context
        "context_heading": "7. Context: the same token at the same position, different after attention",
        "context_explain": (
            "**What it shows:** input x = embedding + sinusoidal position, through one causal "
            "attention head with identity Q, K and V. **Try:** change the middle word, make the "
            "sentences equal, or a last word that differs. **Why:** the inputs at “zamek” are "
            "identical (same row, same position); only attention to the earlier words tells them "
            "apart."
        ),
        "context_a": "Sentence A",
        "context_positions": "Positions in the input",
        "context_positions_on": "on: x = embedding + position",
        "context_positions_off": "off: x = embedding alone",
        "context_off_hint": "Positions are off: write B as A's words in another order (e.g. “zamek kamienny oto”) to see that attention alone cannot tell the orders apart.",
        "context_equivariant": "B is A's words reordered by π = {perm}; with positions off (and the mask off, every word seeing every word) the outputs are A's reordered the same way: max |out_B − out_A[π]| = {diff:g}. Without positions, “the dog bit the man” and “the man bit the dog” get the same vectors, only shuffled.",
        "context_b": "Sentence B",
        "context_button": "Compute",
        "equal_button": "Make them equal",
        "context_inputs": "At the last word “{word}” (position {pos}): the inputs differ by max {diff:g}",
        "context_outputs": "The attention outputs there differ by max {diff:g}",
        "context_same_input": "identical inputs",
        "context_different_output": "different outputs: the head mixed in the context",
        "context_same_output": "identical outputs: the contexts are the same",
        "context_inputs_other": "The last words differ: “{a}” (position {pos_a}) and “{b}” (position {pos_b}); their inputs differ by max {diff:g}",
        "context_inputs_moved": "The last word is “{word}” in both, but at position {pos_a} in A and {pos_b} in B: a different position, so their inputs differ by max {diff:g}",
        "context_inputs_words": "The last words differ: “{a}” in A and “{b}” in B (both at position {pos}); their inputs differ by max {diff:g}",
        "context_key_position": "key position",
        "context_query_position": "query position",
        "context_weights_alt": "Heatmap of sentence {side}'s {t} × {t} attention weights; the last word's largest weight is {last}.",
        "context_inputs_differ": "the inputs already differ, so this does not isolate the context; end both sentences with the same word at the same position",
        "context_weights": "Attention weights of {side}, “{sentence}” (row: query, column: key)",
        "context_mask_note": "Hatched: masked (a later word, not seen).",
        "context_vectors": "At each sentence's last word (A: “{a}”, B: “{b}”)",
        "context_input_row": "input x, {side}",
        "context_output_row": "output, {side}",
        # ---- 8. positions
        "positions_heading": "8. Positions: each pair of dimensions oscillates at its own rate, like the hands of a clock",
        "positions_dim": "Width D (even)",
        "positions_pos": "Position",
        "positions_pair": "Pair i",
        "positions_length": "Positions shown",
        "positions_button": "Show",
        "positions_explain": (
            "**What it shows:** the sinusoidal position table (it does not read W_E). **Try:** "
            "position 5, pair 1 gives PE(5, 2) = sin(5·ω₁); a wider D; a far position. **Why:** "
            "each pair turns at its own rate, so every position gets a distinct pattern and the "
            "dot product of two positions depends only on their offset."
        ),
        "positions_values": (
            "ω_{pair} = 1/10000^(2·{pair}/{dim}) = {omega:.4g} rad per position (one turn every "
            "{period} positions). PE({pos}, {even}) = sin({pos}·ω) = {sin:+.4f}; "
            "PE({pos}, {odd}) = cos({pos}·ω) = {cos:+.4f}."
        ),
        "positions_heatmap": "The sinusoidal table: position × dimension",
        "positions_pos_clamped": "Position {typed} is past the {length} positions shown (0 to {pos}), so position {pos} is used; show more positions to reach it.",
        "positions_pair_clamped": "Width D = {dim} has pairs 0 to {pair}, so pair {pair} is used instead of {typed}; a wider D reaches it.",
        "positions_heatmap_alt": "Heatmap of the sinusoidal position table, {length} positions × {dim} dimensions, the chosen pair outlined.",
        "positions_dimension": "dimension (pairs 2i, 2i+1: sin, cos)",
        "positions_position": "position",
        "positions_similarity": "P[{pos}] · P[{pos} + k] as a function of the offset k",
        "positions_offset": "offset k",
        "positions_dot": "dot product",
        "positions_clock": "Position {pos} as clock hands: pair i points at angle {pos}·ω_i",
        "positions_clock_some": "({shown} of the {pairs} pairs, spread from the first to the last)",
        # ---- 2. realistic sizes
        "sizes_heading": "2. The article's own ids and the lesson's real sizes",
        "sizes_explain": (
            "**What it shows:** the article's lookup [6, 9, 6] on its fragment of a table of "
            "three coordinates; then the lesson's example, V, d = 512, 128 and x = tok_emb(ids) "
            "for [76, 299, 412], through the model's own `Embeddings`; its later "
            "h⁽⁰⁾ = x + W_P[0 .. T−1] with learned positions up to block_size 64; and what tying "
            "the read-out to W_E saves in GPT-2 small (V = 50,257, d = 768). **Try:** other ids "
            "below 512; a length past 64. **Why:** a lookup reads rows, so its cost does not grow "
            "with V; a learned position table simply has no row past block_size. This part does "
            "not read the shared table."
        ),
        "sizes_ids": "Ids into the lesson's W_E (0 to 511; [76, 299, 412, ...] and [[76, 299, 412]] are read as the lesson writes them)",
        "sizes_distance": "Distances ‖W_E[i] − W_E[j]‖ between the rows of ids {ids} in the lesson's W_E",
        "sizes_distance_note": "An id is only a name: ids close in number are not close in space (the lesson's “token 300 is no closer to 301 than to 7”: here ‖W_E[300] − W_E[301]‖ = {near:.4f} and ‖W_E[300] − W_E[7]‖ = {far:.4f}).",
        "sizes_readout": "The read-out through the tied table: logits = h⁽⁰⁾ · W_Eᵀ, shape (1, {t}, {vocab}) (the first {shown} of {vocab} columns)",
        "sizes_readout_note": "Logit v of a position is h · W_E[v]: the same ({vocab}, {dim}) table read backwards, no second matrix (the model's own tied read-out, Embeddings.attend).",
        "sizes_article_heading": "The article's example: [6, 9, 6] on its fragment of a W_E of three coordinates",
        "sizes_lesson_heading": "The lesson's W_E: its own table of V, d = 512, 128 (neither the shared 6 × 6 table nor the article's fragment)",
        "sizes_other_table": "Ids {ids} here read rows of the lesson's W_E (512 × 128), not the article's fragment above: another table, whose rows of the same ids hold other numbers.",
        "ids_read_ellipsis": "Read as {ids}: the closing “...”, the lesson's “and so on”, is left out.",
        "ids_read_batch": "Read as {ids}: [[...]] is a batch of one sequence, shape (1, {t}); its one row is looked up.",
        "sizes_length": "A sequence of this many tokens (1 to 128: twice block_size, to see where it stops)",
        "sizes_button": "Show",
        "sizes_fragment": "A fragment of W_E in the article's form: rows 6 and 9, three coordinates each, separated by semicolons as the article writes them (the numbers are the lab's own)",
        "sizes_article": "The article's ids {ids}: the first, the second and again the first of the rows shown; shape ({t}, 3)",
        "sizes_article_note": "Positions 0 and 2 read row 6: the same vector twice; position 1 reads row 9.",
        "sizes_real_result": "The lesson's x = tok_emb(ids) for ids {ids}: shape {shape}, no positions (the first {shown} of {dim} coordinates)",
        "sizes_real_note": "The lesson's sizes V, d = {vocab}, {dim}: W_E is ({vocab}, {dim}), {vocab} × {dim} = {params} parameters, initialised as in training (N(0, 0.02²)); the lookup reads only the rows of the ids.",
        "sizes_h0_result": "Later, h⁽⁰⁾ = x + W_P[0 .. T−1] for ids {ids}: shape {shape} (the first {shown} of {dim} coordinates)",
        "sizes_h0_note": "W_P holds learned positions: ({block}, {dim}), one row per position up to block_size {block}.",
        "sizes_fits": "A sequence of {t} tokens fits: W_P has rows 0 to {last}.",
        "sizes_beyond": "A sequence of {t} tokens does not fit: W_P has rows 0 to {last} only, so the model refuses it (its check: T ≤ block_size = {block}).",
        "sizes_tying": "Weight tying: GPT-2 small's read-out reuses W_E ({vocab} × {dim} = {table} parameters) instead of a second matrix of its own: {tied} parameters tied, {untied} untied.",
        # ---- input errors
        "malformed_list": "{field}: “{text}” is not a list of whole numbers; write e.g. {example}.",
        "empty_list": "{field}: the list is empty; type at least one id, e.g. {example}.",
        "not_an_id": "{field}: “{item}” is not a whole number; ids are 0 to {high}, e.g. {example}.",
        "id_out_of_range": "{field}: id {id} is out of range; the table has rows 0 to {high}.",
        "article_ids_elsewhere": "ids: {ids} is the article's example: it reads rows 6 and 9 of the article's fragment, shown in part 2; this table has rows 0 to {high}.",
        "permutation_length": "permutation: it must list each id 0 to {high} once ({size} numbers), got {got}.",
        "permutation_repeat": "permutation: id {id} appears twice and {missing} is missing; list each id once.",
        "not_a_number": "{field}: “{text}” is not a number; write e.g. 0.4.",
        "not_a_number_comma": "{field}: “{text}” is not a number; write the decimal point as a point, e.g. 0.4.",
        "number_out_of_bounds": "{field}: {text} is out of range; use {low:g} to {high:g}.",
        "pace_too_slow": "pace: {text} steps a second would leave a run going for hours; use 0 (as fast as it can) or {low:g} to {high:g}.",
        "too_long": "{field}: the text is {got} characters long; the limit is {limit}.",
        "too_many_ids": "{field}: {got} ids; the limit is {limit} per lookup.",
        "too_many_words": "sentence: {got} words; the limit is {limit} per sentence.",
        "table_not_finite": "the result would leave float32's range (nan or ±inf in W_E); use a smaller learning rate or value.",
        "not_finite": "{field}: {text} is not a finite number in float32; write e.g. 0.4.",
        "rounds_to_zero": "{field}: {text} rounds to 0 in float32 (its smallest non-zero value is ≈ {smallest:.2g}); type 0 for no change, or a larger value.",
        "not_an_integer": "{field}: “{text}” is not a whole number; use {low} to {high}.",
        "out_of_bounds": "{field}: {value} is out of range; use {low} to {high}.",
        "odd_width": "width D: {value} is odd; the sinusoids come in (sin, cos) pairs, so use an even width such as {even}.",
        "empty_sentence": "sentence: it is empty; use the words {vocab}.",
        "unknown_word": "sentence: “{word}” is not in the vocabulary; use the words {vocab}.",
        # ---- field names inside the messages above
        "field_ids": "ids",
        "field_permutation": "permutation",
        "field_learning_rate": "learning rate",
        "field_row": "row",
        "field_dimension": "coordinate",
        "field_value": "new value",
        "field_width": "width D",
        "field_position": "position",
        "field_pair": "pair i",
        "field_length": "positions shown",
        "field_sizes_length": "sequence length",
        "field_steps": "N steps",
        "field_sentence": "sentence",
        "field_edit_value": "value",
        "field_step_lr": "learning rate",
        "field_step_pace": "pace",
    },
    "es": {
        # ---- página
        "title": "minigpt-jax: laboratorio de embeddings",
        "intro": (
            "Seis tokens, seis coordenadas cada uno: una tabla de embeddings W_E (6×6) que comparten "
            "todas las partes de esta página. Renombrar ids, editar una coordenada y dar un paso de "
            "entrenamiento cambian esa misma tabla, y las partes siguientes la leen. Cada número lo "
            "calcula el código JAX de minigpt_jax (las mismas funciones que `experiments/`)."
        ),
        "table_heading": "La tabla compartida W_E (filas: ids de token, columnas: coordenadas): V × d = 6 × 6 = 36 parámetros",
        "error_prefix": "Error en la entrada",
        "scroll_hint": "⇆ más ancha que la pantalla: desliza hacia el lado para ver el resto",
        "thousands": "\u202f",  # a narrow no-break space, as the RAE advises
        "aria": [
            ["number input for ", "campo numérico de "],
            ["range slider for ", "deslizador de "],
            ["Reset to default value", "Restablecer el valor inicial"],
        ],
        "kept_state": "no se ha cambiado nada.",
        "unexpected_error": "Error inesperado ({error}); no se ha cambiado nada. Por favor, infórmanos.",
        "storage_fresh": "Esta es la tabla del artículo. Tus cambios se guardan en este navegador: al recargar vuelven (las pestañas de un navegador comparten esa copia: se guarda la de la última pestaña que cambió).",
        "storage_restored": "Tu tabla se ha recuperado del almacenamiento de este navegador ({n} pasos dados). «Restablecer la tabla» empieza de nuevo.",
        # ---- 1. búsqueda
        "lookup_heading": "1. Búsqueda: un id de token lee una fila de la tabla",
        "lookup_ids": "Ids de token (una lista, p. ej. [0, 1, 0])",
        "lookup_button": "Buscar",
        "lookup_explain": (
            "**Qué muestra:** una búsqueda es una matriz one-hot por la tabla: la fila t de "
            "one_hot(ids) tiene un solo 1, en la columna id_t, así que elige la fila id_t de W_E. "
            "**Prueba:** repite un id, p. ej. [2, 2, 2], y cambia la tabla más abajo (deslizador, "
            "paso); el resultado la sigue. **Por qué:** no se calcula nada con el token; su id solo "
            "dice qué fila leer."
        ),
        "lookup_one_hot_matrix": "one_hot(ids): (T, 6)",
        "lookup_rows": "W_E (filas leídas resaltadas)",
        "lookup_result": "El resultado x, forma ({t}, {d}): la fila t es W_E[id_t]",
        "lookup_one_hot": "max |x − one_hot(ids) · W_E| = {diff:g}: la búsqueda es igual al producto one-hot.",
        "lookup_repeat": "El id {id} ({word}) se repite en las posiciones {positions}: vectores idénticos (diferencia máxima {diff:g}).",
        "lookup_no_repeat": "Ningún id se repite; escribe uno dos veces, p. ej. [0, 1, 0], para ver vectores idénticos.",
        # ---- 3. renombrar
        "rename_heading": "3. Renombrar los ids: los ids solo son nombres de filas",
        "rename_ids": "Ids de token que buscar",
        "rename_perm": "Permutación π (el id i pasa a ser π[i]), p. ej. [5, 3, 0, 1, 2, 4]",
        "rename_mode": "Renombrar",
        "mode_both": "ids y filas a la vez",
        "mode_ids": "solo los ids",
        "mode_rows": "solo las filas",
        "rename_button": "Renombrar",
        "rename_explain": (
            "**Qué muestra:** la misma búsqueda antes y después de renombrar con una permutación π. "
            "**Prueba:** «solo los ids» o «solo las filas» (un supuesto) y luego ambos a la vez, "
            "que se aplica a la tabla compartida; pulsa Renombrar otra vez para deshacerlo. "
            "**Por qué:** un id no significa nada por sí mismo; solo importa qué fila le toca."
        ),
        "rename_preview": "Vista previa sobre la tabla actual:",
        "rename_table_after": "W_E tras renombrar",
        "rename_will_apply": "Al pulsar Renombrar se aplica a la tabla compartida.",
        "rename_what_if": "Un supuesto: pulsar Renombrar no cambia la tabla compartida.",
        "rename_before": "Antes: ids {ids}",
        "rename_after": "Después: ids {ids}",
        "rename_same": "max |x_después − x_antes| = {diff:g}: el resultado no cambia.",
        "rename_changed": "max |x_después − x_antes| = {diff:g}: el resultado cambia, porque solo se renombró un lado.",
        "rename_applied": "Aplicado (max |x_después − x_antes| = {diff:g}): la tabla compartida y su vocabulario usan ahora los ids nuevos, «{word}» es el id {id}. Los campos tienen ahora la inversa de π y los ids renombrados: pulsa Renombrar otra vez para deshacerlo.",
        "rename_not_applied": "Esto era un supuesto: la tabla compartida no cambia.",
        "rename_fields_mapped": "Las partes 1 y 4 conservan sus palabras: sus ids también se renombraron con π (búsqueda {lookup}, edición {edit}, fila {row}).",
        # ---- 4. editar
        "edit_heading": "4. Editar una coordenada: cambia cada aparición de ese token, nada más",
        "edit_explain": (
            "**Qué muestra:** un número de la tabla y una búsqueda que lo lee. **Prueba:** elige "
            "una fila y una coordenada y arrastra el deslizador (o escribe un valor y pulsa "
            "Fijar): las posiciones resaltadas, las apariciones de ese id, cambian en directo, y "
            "también las demás partes. **Por qué:** cada aparición de un token lee la misma fila, "
            "así que no pueden diferir antes de la atención."
        ),
        "edit_ids": "Ids de token que buscar",
        "edit_row": "Fila (id de token)",
        "edit_dim": "Coordenada",
        "edit_slider": "W_E[{row}, {dim}] ({word}): arrastra para cambiarlo",
        "edit_value": "O escribe un valor (|valor| ≤ 100; 0,9 vale)",
        "edit_button": "Fijar",
        "edit_table": "W_E, la tabla compartida",
        "edit_slider_moved": "El deslizador mostraba otra celda cuando llegó esa tecla: no se ha escrito nada. Ahora muestra W_E[{row}, {dim}] = {value:+.3f}.",
        "edit_lookup": "Búsqueda de {ids} (las apariciones del id {row} resaltadas)",
        "edit_occurs": "El id {row} ({word}) aparece en las posiciones {positions}: esas filas son W_E[{row}] y se mueven juntas.",
        "edit_absent": "El id {row} ({word}) no aparece en estos ids: editar su fila no cambia ninguno.",
        "edit_same": "W_E[{row}, {dim}] ya vale {value:+.3f}: no ha cambiado nada (el id {row} aparece en las posiciones {positions}).",
        "edit_summary": "W_E[{row}, {dim}] ({word}): {old:+.3f} → {new:+.3f}.",
        "edit_changed": "Posiciones cuyo vector cambió: {positions} (las apariciones del id {row}); el resto de posiciones: cambio máximo {other:g}.",
        "edit_nothing": "El id {row} no aparece en los ids, así que ningún vector buscado cambió.",
        "edit_no_effect": "Nota: la coordenada {dim} de kamienny no mueve p({target}) en la parte 5, porque w_zamek y w_klucz coinciden ahí (Δw[{dim}] = 0); prueba la coordenada 0, 1 o 2.",
        # ---- 5. paso
        "step_heading": "5. Un paso de entrenamiento: entrada «{input}», objetivo «{target}» (no «{rival}»)",
        "step_explain": (
            "**Qué muestra:** dos vectores de salida congelados convierten la fila de entrada en "
            "dos logits; un paso de SGD simple resta tasa × gradiente (de jax.grad). **Prueba:** un "
            "paso (47,0% → 61,0%), luego 50 mirando la gráfica; una tasa negativa; una edición "
            "entre tandas. **Por qué:** solo la fila leída tiene gradiente, y apunta según "
            "w_zamek − w_klucz, así que p(zamek) sube y las demás filas quedan idénticas bit a bit."
        ),
        "step_lr": "Tasa de aprendizaje (|tasa| ≤ 10; 0,4 vale)",
        "step_button": "Dar un paso de entrenamiento",
        "step_n": "N pasos (1–500)",
        "step_pace": "Ritmo: pasos por segundo (0 = lo más rápido posible, o de 1 a 1000)",
        "steps_button": "Dar N pasos",
        "reset_button": "Restablecer la tabla",
        "step_p": "p({target})",
        "step_loss": "pérdida",
        "step_gap": "brecha g = logit_{target} − logit_{rival}",
        "step_logit": "logit_{word} = w_{word} · x",
        "step_softmax": "p({word}) = softmax(logits)_{word}",
        "step_loss_row": "pérdida de entropía cruzada L = −ln p({target})",
        "step_before": "antes del paso",
        "steps_before": "antes de los {n} pasos",
        "step_now": "ahora",
        "step_none": "Ningún paso desde el último cambio de la tabla: da uno para comparar.",
        "steps_running": "Entrenando: {done} de {n} pasos…",
        "steps_done": "Hecho: {n} de {n} pasos.",
        "step_done": "Hecho: un paso.",
        "steps_stopped": "Detenido tras {done} de {n} pasos.",
        "stop_button": "Detener",
        "step_lr_zero": "La tasa es 0: la tabla no se movió, pero el paso cuenta (tasa × gradiente = 0).",
        "step_chart_alt": "Gráfica de p({target}) y la pérdida en {n} puntos: p({target}) de {first:.3f} a {last:.3f}, pérdida ahora {loss:.3f}.",
        "step_grad_applied": "El gradiente dpérdida/dW_E en la tabla de antes del paso; el paso restó la tasa = {lr} por él",
        "steps_grad_applied": "El gradiente dpérdida/dW_E del primero de los {n} pasos; cada paso toma el suyo en su tabla y resta la tasa = {lr} por él",
        "step_row_caption": "Fila {row} ({word}) antes → después de {n} paso(s)",
        "step_row_before": "antes",
        "step_row_change": "cambio (−tasa × gradiente)",
        "steps_row_change": "cambio en los {n} pasos (el −tasa × gradiente de cada paso, sumado)",
        "step_row_after": "después",
        "step_chart": "p(zamek) y pérdida por paso",
        "step_axis": "pasos dados",
        "step_count": "Pasos dados sobre esta tabla: {n}.",
        "step_grad": "El gradiente dpérdida/dW_E en la tabla actual (solo la fila leída es distinta de cero)",
        "step_rows": "Filas que cambió el paso: {rows}; las demás filas son idénticas bit a bit.",
        "step_outputs": "Vectores de salida congelados",
        "step_figures_label": "Las cifras del paso, una columna por tabla",
        "reset_done": "La tabla vuelve a ser la del artículo (ids, filas y pasos restablecidos).",
        "reset_fields_mapped": "Las partes 1 y 4 conservan sus palabras: sus ids volvieron con los de la tabla (búsqueda {lookup}, edición {edit}, fila {row}).",
        # ---- 6. mapa de tokens
        "map_heading": "6. El mapa de tokens: los seis vectores, que se mueven cuando cambia la tabla",
        "map_explain": (
            "**Qué muestra:** cada fila como un punto sobre las dos direcciones principales de la "
            "tabla del artículo (PCA; ejes fijos, así que se mueven los puntos y no los ejes), y el "
            "coseno de cada par de filas. **Prueba:** da 50 pasos y mira cómo se mueve kamienny; "
            "arrastra una coordenada. **Por qué:** entrenar mueve las filas leídas; la geometría es "
            "todo lo que ve un modelo."
        ),
        "map_axis": "eje {k}",
        "map_points": "Cada fila sobre los dos ejes principales de la tabla del artículo",
        "map_cosine": "Similitud coseno de las filas",
        "map_cosine_alt": "Mapa de calor de la similitud coseno de cada par de las {n} filas (la tabla de al lado da los valores).",
        # ---- 7. contexto
        "context_heading": "7. Contexto: el mismo token en la misma posición, distinto tras la atención",
        "context_explain": (
            "**Qué muestra:** entrada x = embedding + posición sinusoidal, por una cabeza de "
            "atención causal con Q, K y V identidad. **Prueba:** cambia la palabra del medio, "
            "iguala las frases o termina con otra palabra. **Por qué:** las entradas en «zamek» son "
            "idénticas (misma fila, misma posición); solo la atención a las palabras anteriores "
            "las distingue."
        ),
        "context_a": "Frase A",
        "context_positions": "Posiciones en la entrada",
        "context_positions_on": "sí: x = embedding + posición",
        "context_positions_off": "no: x = solo el embedding",
        "context_off_hint": "Las posiciones están quitadas: escribe en B las palabras de A en otro orden (p. ej. «zamek kamienny oto») para ver que la atención sola no distingue los órdenes.",
        "context_equivariant": "B son las palabras de A reordenadas por π = {perm}; sin posiciones (y sin máscara, cada palabra ve a todas) las salidas son las de A reordenadas igual: max |salida_B − salida_A[π]| = {diff:g}. Sin posiciones, «el perro mordió al hombre» y «el hombre mordió al perro» dan los mismos vectores, solo barajados.",
        "context_b": "Frase B",
        "context_button": "Calcular",
        "equal_button": "Igualarlas",
        "context_inputs": "En la última palabra «{word}» (posición {pos}): las entradas difieren como máximo {diff:g}",
        "context_outputs": "Las salidas de la atención ahí difieren como máximo {diff:g}",
        "context_same_input": "entradas idénticas",
        "context_different_output": "salidas distintas: la cabeza mezcló el contexto",
        "context_same_output": "salidas idénticas: los contextos son iguales",
        "context_inputs_other": "Las últimas palabras difieren: «{a}» (posición {pos_a}) y «{b}» (posición {pos_b}); sus entradas difieren como máximo {diff:g}",
        "context_inputs_moved": "La última palabra es «{word}» en ambas, pero en la posición {pos_a} en A y {pos_b} en B: otra posición, así que sus entradas difieren como máximo {diff:g}",
        "context_inputs_words": "Las últimas palabras difieren: «{a}» en A y «{b}» en B (ambas en la posición {pos}); sus entradas difieren como máximo {diff:g}",
        "context_key_position": "posición de la clave",
        "context_query_position": "posición de la consulta",
        "context_weights_alt": "Mapa de calor de los {t} × {t} pesos de atención de la frase {side}; el mayor peso de la última palabra es {last}.",
        "context_inputs_differ": "las entradas ya difieren, así que esto no aísla el contexto; termina ambas frases con la misma palabra en la misma posición",
        "context_weights": "Pesos de atención de {side}, «{sentence}» (fila: consulta, columna: clave)",
        "context_mask_note": "Rayado: enmascarado (una palabra posterior, no vista).",
        "context_vectors": "En la última palabra de cada frase (A: «{a}», B: «{b}»)",
        "context_input_row": "entrada x, {side}",
        "context_output_row": "salida, {side}",
        # ---- 8. posiciones
        "positions_heading": "8. Posiciones: cada par de dimensiones oscila a su propio ritmo, como las agujas de un reloj",
        "positions_dim": "Anchura D (par)",
        "positions_pos": "Posición",
        "positions_pair": "Par i",
        "positions_length": "Posiciones mostradas",
        "positions_button": "Mostrar",
        "positions_explain": (
            "**Qué muestra:** la tabla sinusoidal de posiciones (no lee W_E). **Prueba:** la "
            "posición 5 y el par 1 dan PE(5, 2) = sin(5·ω₁); una D más ancha; una posición lejana. "
            "**Por qué:** cada par gira a su propio ritmo, así que cada posición tiene un patrón "
            "distinto y el producto escalar de dos posiciones solo depende de su distancia."
        ),
        "positions_values": (
            "ω_{pair} = 1/10000^(2·{pair}/{dim}) = {omega:.4g} rad por posición (una vuelta cada "
            "{period} posiciones). PE({pos}, {even}) = sin({pos}·ω) = {sin:+.4f}; "
            "PE({pos}, {odd}) = cos({pos}·ω) = {cos:+.4f}."
        ),
        "positions_heatmap": "La tabla sinusoidal: posición × dimensión",
        "positions_pos_clamped": "La posición {typed} queda fuera de las {length} posiciones mostradas (de 0 a {pos}), así que se usa la posición {pos}; muestra más posiciones para llegar a ella.",
        "positions_pair_clamped": "Con anchura D = {dim} hay pares de 0 a {pair}, así que se usa el par {pair} en vez del {typed}; una D más ancha llega a él.",
        "positions_heatmap_alt": "Mapa de calor de la tabla sinusoidal de posiciones, {length} posiciones × {dim} dimensiones, con el par elegido recuadrado.",
        "positions_dimension": "dimensión (pares 2i, 2i+1: sin, cos)",
        "positions_position": "posición",
        "positions_similarity": "P[{pos}] · P[{pos} + k] en función del desplazamiento k",
        "positions_offset": "desplazamiento k",
        "positions_dot": "producto escalar",
        "positions_clock": "La posición {pos} como agujas de reloj: el par i apunta al ángulo {pos}·ω_i",
        "positions_clock_some": "({shown} de los {pairs} pares, repartidos del primero al último)",
        # ---- 2. tamaños reales
        "sizes_heading": "2. Los ids del propio artículo y los tamaños reales de la lección",
        "sizes_explain": (
            "**Qué muestra:** la búsqueda del artículo [6, 9, 6] en su fragmento de una tabla de "
            "tres coordenadas; luego el ejemplo de la lección, V, d = 512, 128 y x = tok_emb(ids) "
            "para [76, 299, 412], con el propio `Embeddings` del modelo; su h⁽⁰⁾ posterior "
            "= x + W_P[0 .. T−1] con posiciones aprendidas hasta block_size 64; y lo que ahorra "
            "atar la salida a W_E en GPT-2 small (V = 50 257, d = 768). **Prueba:** otros ids por "
            "debajo de 512; una longitud mayor que 64. **Por qué:** una búsqueda lee filas, así "
            "que su coste no crece con V; una tabla de posiciones aprendidas no tiene ninguna fila "
            "más allá de block_size. Esta parte no lee la tabla compartida."
        ),
        "sizes_ids": "Ids en la W_E de la lección (de 0 a 511; [76, 299, 412, ...] y [[76, 299, 412]] se leen como los escribe la lección)",
        "sizes_distance": "Distancias ‖W_E[i] − W_E[j]‖ entre las filas de los ids {ids} en la W_E de la lección",
        "sizes_distance_note": "Un id solo es un nombre: ids cercanos en número no están cerca en el espacio («el token 300 no está más cerca del 301 que del 7», dice la lección: aquí ‖W_E[300] − W_E[301]‖ = {near:.4f} y ‖W_E[300] − W_E[7]‖ = {far:.4f}).",
        "sizes_readout": "La lectura por la tabla atada: logits = h⁽⁰⁾ · W_Eᵀ, forma (1, {t}, {vocab}) (las primeras {shown} de {vocab} columnas)",
        "sizes_readout_note": "El logit v de una posición es h · W_E[v]: la misma tabla de ({vocab}, {dim}) leída al revés, sin una segunda matriz (la lectura atada del propio modelo, Embeddings.attend).",
        "sizes_article_heading": "El ejemplo del artículo: [6, 9, 6] sobre su fragmento de una W_E de tres coordenadas",
        "sizes_lesson_heading": "La W_E de la lección: su propia tabla de V, d = 512, 128 (ni la tabla compartida de 6 × 6 ni el fragmento del artículo)",
        "sizes_other_table": "Los ids {ids} leen aquí filas de la W_E de la lección (512 × 128), no del fragmento del artículo de arriba: es otra tabla, cuyas filas con esos ids tienen otros números.",
        "ids_read_ellipsis": "Leído como {ids}: se deja fuera el «...» final, el «y así sucesivamente» de la lección.",
        "ids_read_batch": "Leído como {ids}: [[...]] es un lote de una secuencia, forma (1, {t}); se busca su única fila.",
        "sizes_length": "Una secuencia de tantos tokens (de 1 a 128: el doble de block_size, para ver dónde se detiene)",
        "sizes_button": "Mostrar",
        "sizes_fragment": "Un fragmento de W_E en la forma del artículo: filas 6 y 9, tres coordenadas cada una, separadas por punto y coma como las escribe el artículo (los números son del laboratorio)",
        "sizes_article": "Los ids del artículo {ids}: la primera, la segunda y otra vez la primera de las filas mostradas; forma ({t}, 3)",
        "sizes_article_note": "Las posiciones 0 y 2 leen la fila 6: el mismo vector dos veces; la posición 1 lee la fila 9.",
        "sizes_real_result": "El x = tok_emb(ids) de la lección para los ids {ids}: forma {shape}, sin posiciones (las primeras {shown} de {dim} coordenadas)",
        "sizes_real_note": "Los tamaños de la lección V, d = {vocab}, {dim}: W_E es ({vocab}, {dim}), {vocab} × {dim} = {params} parámetros, inicializada como en el entrenamiento (N(0; 0,02²)); la búsqueda solo lee las filas de los ids.",
        "sizes_h0_result": "Después, h⁽⁰⁾ = x + W_P[0 .. T−1] para los ids {ids}: forma {shape} (las primeras {shown} de {dim} coordenadas)",
        "sizes_h0_note": "W_P guarda posiciones aprendidas: ({block}, {dim}), una fila por posición hasta block_size {block}.",
        "sizes_fits": "Una secuencia de {t} tokens cabe: W_P tiene las filas 0 a {last}.",
        "sizes_beyond": "Una secuencia de {t} tokens no cabe: W_P solo tiene las filas 0 a {last}, así que el modelo la rechaza (su comprobación: T ≤ block_size = {block}).",
        "sizes_tying": "Atar los pesos: la salida de GPT-2 small reutiliza W_E ({vocab} × {dim} = {table} parámetros) en vez de una segunda matriz propia: {tied} parámetros atados, {untied} sin atar.",
        # ---- errores de entrada
        "malformed_list": "{field}: «{text}» no es una lista de números enteros; escribe p. ej. {example}.",
        "empty_list": "{field}: la lista está vacía; escribe al menos un id, p. ej. {example}.",
        "not_an_id": "{field}: «{item}» no es un número entero; los ids van de 0 a {high}, p. ej. {example}.",
        "id_out_of_range": "{field}: el id {id} está fuera de rango; la tabla tiene las filas 0 a {high}.",
        "article_ids_elsewhere": "ids: {ids} es el ejemplo del artículo: lee las filas 6 y 9 del fragmento del artículo, en la parte 2; esta tabla tiene las filas 0 a {high}.",
        "permutation_length": "permutación: debe listar cada id de 0 a {high} una vez ({size} números), y tiene {got}.",
        "permutation_repeat": "permutación: el id {id} aparece dos veces y falta el {missing}; lista cada id una vez.",
        "not_a_number": "{field}: «{text}» no es un número; escribe p. ej. 0,4.",
        "not_a_number_comma": "{field}: «{text}» no es un número; escribe p. ej. 0,4.",
        "number_out_of_bounds": "{field}: {text} está fuera de rango; usa de {low:g} a {high:g}.",
        "pace_too_slow": "ritmo: con {text} pasos por segundo una tanda duraría horas; usa 0 (lo más rápido posible) o de {low:g} a {high:g}.",
        "too_long": "{field}: el texto tiene {got} caracteres; el límite es {limit}.",
        "too_many_ids": "{field}: {got} ids; el límite es {limit} por búsqueda.",
        "too_many_words": "frase: {got} palabras; el límite es {limit} por frase.",
        "table_not_finite": "el resultado saldría del rango de float32 (nan o ±inf en W_E); usa una tasa o un valor menor.",
        "not_finite": "{field}: {text} no es un número finito en float32; escribe p. ej. 0,4.",
        "rounds_to_zero": "{field}: {text} se redondea a 0 en float32 (su menor valor distinto de cero es ≈ {smallest:.2g}); escribe 0 para no cambiar nada, o un valor mayor.",
        "not_an_integer": "{field}: «{text}» no es un número entero; usa de {low} a {high}.",
        "out_of_bounds": "{field}: {value} está fuera de rango; usa de {low} a {high}.",
        "odd_width": "anchura D: {value} es impar; las sinusoides van en pares (sin, cos), así que usa una anchura par como {even}.",
        "empty_sentence": "frase: está vacía; usa las palabras {vocab}.",
        "unknown_word": "frase: «{word}» no está en el vocabulario; usa las palabras {vocab}.",
        # ---- nombres de campo dentro de los mensajes anteriores
        "field_ids": "ids",
        "field_permutation": "permutación",
        "field_learning_rate": "tasa de aprendizaje",
        "field_row": "fila",
        "field_dimension": "coordenada",
        "field_value": "valor nuevo",
        "field_width": "anchura D",
        "field_position": "posición",
        "field_pair": "par i",
        "field_length": "posiciones mostradas",
        "field_sizes_length": "longitud de la secuencia",
        "field_steps": "N pasos",
        "field_sentence": "frase",
        "field_edit_value": "valor",
        "field_step_lr": "tasa de aprendizaje",
        "field_step_pace": "ritmo",
    },
}


TEXT: dict[str, Words] = {lang: Words(lang, words) for lang, words in _TEXT.items()}


def message(lang: str, key: str, **params) -> str:
    """TEXT[lang][key] formatted with params; a `field` param is itself a key (field_<name>)."""
    if lang not in TEXT:
        raise ValueError(f"language {lang!r} is not one of {', '.join(LANGUAGES)}.")
    words = TEXT[lang]
    if "field" in params:
        params = {**params, "field": words[f"field_{params['field']}"]}
    return words.f(key, **params)
