"""What each part of the lab page shows, recomputed from the shared table and the part's fields."""

from __future__ import annotations

import functools
import math
import re

import gradio as gr
import numpy as np

from minigpt_apps.lab import compute
from minigpt_apps.lab.compute import LabInputError
from minigpt_apps.lab.figures import (
    chart_svg,
    clip,
    clock_figure,
    cosine_svg,
    heatmap_figure,
    plot_html,
    points_svg,
    similarity_figure,
    weights_svg,
)
from minigpt_apps.lab.markup import (
    boxed,
    escape,
    labels,
    lookup_html,
    matrix_html,
    one_hot_html,
    op,
    paragraph,
    side,
    step_words,
    table_html,
    view,
)
from minigpt_apps.lab.state import LabState
from minigpt_apps.lab.text import TEXT, Words

MAX_POSITIONS = compute.MAX_POSITIONS
SLIDER_RANGE = 2.0  # the slider spans ±2 (wider when the coordinate is already beyond)

# view(state, fields, lang) -> {output key: value}; fields holds every widget's value by key.


def number(fields: dict, key: str, lang: str, **limits) -> float:
    return compute.parse_number(fields[key], field=key, decimal_comma=lang == "es", **limits)


def lookup_ids(text: str, vocab_size: int) -> compute.ReadIds:
    """Part 1's ids; the article's [6, 9, 6] is refused with where it lives (the sizes
    part's fragment), not only as out of range."""
    try:
        return compute.read_ids(text, vocab_size)
    except LabInputError as error:
        numbers = tuple(int(n) for n in re.findall(r"[0-9]+", str(text)))
        if error.key == "id_out_of_range" and numbers == compute.ARTICLE_IDS:
            raise LabInputError(
                "article_ids_elsewhere", ids=compute.format_ids(numbers), high=vocab_size - 1
            ) from None
        raise


def lookup_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    vocab_size = len(state.vocab)
    read = lookup_ids(fields["lookup_ids"], vocab_size)
    ids_T = read.ids_T
    x_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    one_hot_TxV = compute.one_hot(ids_T, vocab_size)
    via_one_hot = np.asarray(compute.one_hot_lookup(state.table_VxD, ids_T[None]))[0]
    parts = [
        *read_notes(read, words),
        side(
            one_hot_html(one_hot_TxV, state.vocab, words["lookup_one_hot_matrix"], words),
            op("·"),
            table_html(state, words, caption=words["lookup_rows"], rows_hl=set(ids_T.tolist())),
            op("="),
            lookup_html(
                state, ids_T, words.f("lookup_result", t=len(ids_T), d=x_TxD.shape[1]), words
            ),
        ),
        paragraph(
            words.f("lookup_one_hot", diff=float(np.abs(x_TxD - via_one_hot).max())), "lab-ok"
        ),
    ]
    repeated = [i for i in dict.fromkeys(ids_T.tolist()) if (ids_T == i).sum() > 1]
    for i in repeated:
        positions = np.flatnonzero(ids_T == i)
        diff = float(np.abs(x_TxD[positions] - x_TxD[positions[0]]).max())
        text = words.f(
            "lookup_repeat",
            id=i,
            word=state.vocab[i],
            positions=", ".join(map(str, positions)),
            diff=diff,
        )
        parts.append(paragraph(text, "lab-ok"))
    if not repeated:
        parts.append(paragraph(words["lookup_no_repeat"]))
    return {"lookup_result": view(state, *parts)}


def rename_inputs(state: LabState, fields: dict):
    ids_T = compute.read_ids(fields["rename_ids"], len(state.vocab)).ids_T
    perm_V = compute.parse_permutation(fields["rename_perm"], len(state.vocab))
    return ids_T, perm_V, fields["rename_mode"]


def rename_view(state: LabState, fields: dict, lang: str) -> dict:
    """What renaming by π would do to the lookup, on the current table (a preview)."""
    words = TEXT[lang]
    ids_T, perm_V, mode = rename_inputs(state, fields)
    result = compute.rename(
        state.table_VxD, ids_T, perm_V, ids=mode in ("both", "ids"), rows=mode in ("both", "rows")
    )
    after_vocab = compute.rename_vocab(state.vocab, perm_V) if mode == "both" else state.vocab
    after_state = LabState(result.renamed_table_VxD, after_vocab)
    same = result.max_abs_diff == 0
    html_parts = [
        paragraph(words["rename_preview"]),
        side(
            lookup_html(
                state, ids_T, words.f("rename_before", ids=compute.format_ids(ids_T)), words
            ),
            lookup_html(
                after_state,
                result.renamed_ids_T,
                words.f("rename_after", ids=compute.format_ids(result.renamed_ids_T)),
                words,
            ),
            table_html(
                after_state,
                words,
                caption=words["rename_table_after"],
                rows_hl=set(result.renamed_ids_T.tolist()),
            ),
        ),
        paragraph(
            words.f("rename_same" if same else "rename_changed", diff=result.max_abs_diff),
            "lab-ok lab-big" if same else "lab-diff lab-big",
        ),
        paragraph(words["rename_will_apply" if mode == "both" else "rename_what_if"]),
    ]
    return {"rename_result": view(state, *html_parts)}


def edit_cell(state: LabState, fields: dict) -> tuple[int, int]:
    vocab_size, dim_count = state.table_VxD.shape
    row = compute.parse_int(fields["edit_row"], field="row", low=0, high=vocab_size - 1)
    dim = compute.parse_int(fields["edit_dim"], field="dimension", low=0, high=dim_count - 1)
    return row, dim


def shortest(value) -> float:
    """The float32 value as its shortest decimal (0.4, not 0.4000000059604645): what the slider
    holds; float32(shortest(v)) == float32(v)."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def edit_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    ids_T = compute.read_ids(fields["edit_ids"], len(state.vocab)).ids_T
    row, dim = edit_cell(state, fields)
    occurrences = set(np.flatnonzero(ids_T == row).tolist())
    value = float(state.table_VxD[row, dim])
    ids = compute.format_ids(ids_T)
    found = ", ".join(map(str, sorted(occurrences)))
    html_parts = [
        side(
            table_html(state, words, caption=words["edit_table"], cells_hl={(row, dim)}),
            lookup_html(
                state, ids_T, words.f("edit_lookup", ids=ids, row=row), words, rows_hl=occurrences
            ),
        ),
        paragraph(
            words.f(
                "edit_occurs" if occurrences else "edit_absent",
                row=row,
                word=state.vocab[row],
                positions=found,
            )
        ),
    ]
    if row == state.vocab.index(compute.STEP_INPUT) and dim >= 3:
        html_parts.append(paragraph(words.f("edit_no_effect", dim=dim, target=compute.STEP_TARGET)))
    low, high = min(-SLIDER_RANGE, math.floor(value)), max(SLIDER_RANGE, math.ceil(value))
    label = words.f("edit_slider", row=row, dim=dim, word=state.vocab[row])
    return {
        "edit_result": view(state, *html_parts),
        "edit_slider": gr.update(value=shortest(value), minimum=low, maximum=high, label=label),
        "edit_shown": f"{row},{dim}",  # set with the slider: its key's event names its cell
        "edit_row": gr.update(choices=[(name, str(i)) for i, name in enumerate(labels(state))]),
    }


def stats(state: LabState) -> compute.Stats:
    input_id = state.vocab.index(compute.STEP_INPUT)
    return compute.step_stats(state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id)


def _figures_html(columns: list[tuple[str, compute.Stats]], words: Words) -> str:
    """The two logits, their softmax, the loss and the logit gap, one column per table (labels
    wrap on phones), in the article's order."""
    names = step_words()
    rows = [
        (words.f("step_logit", word=names["target"]), lambda s: words.num(s.logit_target, "+.4f")),
        (words.f("step_logit", word=names["rival"]), lambda s: words.num(s.logit_rival, "+.4f")),
        (words.f("step_softmax", word=names["target"]), lambda s: words.num(s.p, ".1%")),
        (words.f("step_softmax", word=names["rival"]), lambda s: words.num(s.p_rival, ".1%")),
        (words.f("step_loss_row", **names), lambda s: words.num(s.loss, ".3f")),
        (words.f("step_gap", **names), lambda s: words.num(s.gap, "+.4f")),
    ]
    head = "<tr><th></th>" + "".join(f"<th>{escape(name)}</th>" for name, _ in columns) + "</tr>"
    body = "".join(
        f'<tr><th scope="row">{escape(label)}</th>'
        + "".join(f"<td>{show(stats)}</td>" for _, stats in columns)
        + "</tr>"
        for label, show in rows
    )
    table = f'<table class="lab-table lab-big lab-figures" id="step-figures">{head}{body}</table>'
    return boxed(table, "", words, name=words["step_figures_label"])


def _chart_points(state: LabState, now: compute.Stats) -> list:
    """(steps taken, p(target), loss) after each step taken, and at the table as it is now."""
    points = list(state.history)
    if not points or points[-1] != (state.steps, now.p, now.loss):
        points.append((state.steps, now.p, now.loss))  # an edit since the last step shows a jump
    return points


def _chart_html(state: LabState, now: compute.Stats, words: Words) -> str:
    points = _chart_points(state, now)
    alt = words.f(
        "step_chart_alt",
        n=len(points),
        first=points[0][1],
        last=points[-1][1],
        loss=points[-1][2],
        **step_words(),
    )
    return plot_html(chart_svg(points, words), alt, words.lang, "step-chart")


def lr_text(learning_rate: float, words: Words) -> str:
    """The learning rate a step used (float32) as a plain decimal, like the tables beside it
    ("0.00001", not "1e-05"); below 1e-6 in scientific notation, where a decimal would be
    long."""
    value = np.float32(learning_rate)
    if value != 0 and abs(value) < 1e-6:
        return words.num(float(value), ".3e")
    plain = np.format_float_positional(value, unique=True, trim="-")
    return plain.replace(".", ",") if words.lang == "es" else plain


def _applied_html(state: LabState, run: dict, words: Words) -> str:
    """The gradient the run's first step subtracted and each changed row before → after."""
    grad_VxD = np.asarray(run["grad"], np.float32)
    grad_rows = set(np.flatnonzero(np.abs(grad_VxD).max(1) > 0).tolist())
    parts = [
        matrix_html(
            grad_VxD,
            labels(state),
            range(grad_VxD.shape[1]),
            words=words,
            caption=words.f("step_grad_applied", lr=lr_text(run["lr"], words))
            if run["n"] == 1
            else words.f("steps_grad_applied", lr=lr_text(run["lr"], words), n=run["n"]),
            rows_hl=grad_rows,
            spec="+.4f",
            table_id="step-grad",
        )
    ]
    for i in run["rows"]:
        before_D = np.asarray(run["before"][i], np.float32)
        rows = [before_D, state.table_VxD[i] - before_D, state.table_VxD[i]]
        change = (
            words["step_row_change"]
            if run["n"] == 1
            else words.f("steps_row_change", n=run["n"])  # the total, not one step's
        )
        row_labels = [words["step_row_before"], change, words["step_row_after"]]
        caption = words.f("step_row_caption", row=i, word=state.vocab[i], n=run["n"])
        parts.append(
            matrix_html(
                np.stack(rows),
                row_labels,
                range(len(before_D)),
                words=words,
                caption=caption,
                spec="+.4f",
                table_id=f"step-row-{i}",
            )
        )
    return side(*parts)


def step_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    now = stats(state)
    input_id = state.vocab.index(compute.STEP_INPUT)
    run = state.last_run
    if run is not None:
        before_VxD = np.asarray(run["before"], np.float32)  # the table the run started from
        before = compute.step_stats(before_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id)
        title = words["step_before"] if run["n"] == 1 else words.f("steps_before", n=run["n"])
        columns = [(title, before), (words["step_now"], now)]
        changed = ", ".join(f"{i} {state.vocab[i]}" for i in run["rows"]) or "—"
        notes = [paragraph(words.f("step_rows", rows=changed), "lab-ok")]
        gradient = _applied_html(state, run, words)
    else:
        columns = [(words["step_now"], now)]
        notes = [paragraph(words["step_none"])]
        grad_VxD = compute.step_gradient(state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id)
        grad_rows = set(np.flatnonzero(np.abs(grad_VxD).max(1) > 0).tolist())
        gradient = matrix_html(
            grad_VxD,
            labels(state),
            range(grad_VxD.shape[1]),
            words=words,
            caption=words["step_grad"],
            rows_hl=grad_rows,
            spec="+.4f",
            table_id="step-grad",
        )
    html_parts = [
        _figures_html(columns, words),
        *notes,
        paragraph(words.f("step_count", n=state.steps)),
        gradient,
    ]
    return {
        "step_result": view(state, *html_parts),
        "step_chart": _chart_html(state, now, words),
    }


def map_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    tokens = compute.token_map(state.table_VxD)
    cosine = matrix_html(
        tokens.cosine_VxV,
        labels(state),
        state.vocab,
        words=words,
        caption=words["map_cosine"],
        spec="+.2f",
    )
    points = matrix_html(
        tokens.points_Vx2,
        labels(state),
        [words.f("map_axis", k=1), words.f("map_axis", k=2)],
        words=words,
        caption=words["map_points"],
    )
    where = "; ".join(
        f"{word} ({words.num(x, '+.2f')}; {words.num(y, '+.2f')})"
        for word, (x, y) in zip(state.vocab, tokens.points_Vx2, strict=True)
    )
    return {
        "map_result": view(state, side(points, cosine)),
        "map_points": plot_html(
            points_svg(state, tokens.points_Vx2, words),
            f"{words['map_points']}: {where}",
            lang,
            "map-points",
        ),
        "map_cosine": plot_html(
            cosine_svg(state, tokens.cosine_VxV, words),
            words.f("map_cosine_alt", n=len(state.vocab)),
            lang,
            "map-cosine",
        ),
    }


def _context_findings(heads, vocab, words: Words) -> list[str]:
    """Whether the last words' inputs and outputs differ, and what that says."""
    (_, ids_a, head_a), (_, ids_b, head_b) = heads
    input_diff = float(np.abs(head_a.inputs_TxD[-1] - head_b.inputs_TxD[-1]).max())
    output_diff = float(np.abs(head_a.outputs_TxD[-1] - head_b.outputs_TxD[-1]).max())
    word_a, word_b = vocab[ids_a[-1]], vocab[ids_b[-1]]
    pos_a, pos_b = len(ids_a) - 1, len(ids_b) - 1
    if word_a == word_b and pos_a == pos_b:
        where = words.f("context_inputs", word=word_a, pos=pos_a, diff=input_diff)
    elif word_a == word_b:  # the same word, moved: only its position differs
        where = words.f(
            "context_inputs_moved", word=word_a, pos_a=pos_a, pos_b=pos_b, diff=input_diff
        )
    elif pos_a == pos_b:
        where = words.f("context_inputs_words", a=word_a, b=word_b, pos=pos_a, diff=input_diff)
    else:
        where = words.f(
            "context_inputs_other", a=word_a, pos_a=pos_a, b=word_b, pos_b=pos_b, diff=input_diff
        )
    if input_diff > 0:
        verdict, cls = words["context_inputs_differ"], "lab-diff lab-big"
    elif output_diff > 0:
        verdict, cls = words["context_different_output"], "lab-diff lab-big"
    else:
        verdict, cls = words["context_same_output"], "lab-ok lab-big"
    same_input = f" ({words['context_same_input']})." if input_diff == 0 else "."
    return [
        paragraph(where + same_input, "lab-ok"),
        paragraph(f"{words.f('context_outputs', diff=output_diff)} ({verdict}).", cls),
    ]


def _reordering(ids_a, ids_b) -> np.ndarray | None:
    """π with ids_b = ids_a[π] when B's words are A's in another order (None otherwise)."""
    if len(ids_a) != len(ids_b) or sorted(ids_a.tolist()) != sorted(ids_b.tolist()):
        return None
    unused, perm = list(range(len(ids_a))), []
    for i in ids_b.tolist():
        k = next(k for k in unused if ids_a[k] == i)
        unused.remove(k)
        perm.append(k)
    return np.array(perm)


def _equivariance(state: LabState, heads, words: Words) -> list[str]:
    """With positions off and B a reordering of A: out_B = out_A[π] for the head without its
    mask (permutation equivariance), said with the largest difference."""
    (_, ids_a, _), (_, ids_b, _) = heads
    perm = _reordering(ids_a, ids_b)
    if perm is None:
        return [paragraph(words["context_off_hint"])]
    out_a = compute.one_head(state.table_VxD, ids_a, positions=False, causal=False).outputs_TxD
    out_b = compute.one_head(state.table_VxD, ids_b, positions=False, causal=False).outputs_TxD
    diff = float(np.abs(out_b - out_a[perm]).max())
    text = words.f("context_equivariant", perm=compute.format_ids(perm), diff=diff)
    return [paragraph(text, "lab-ok lab-big")]


def context_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    positions = fields.get("context_positions", "on") != "off"
    heads = []
    for key in ("context_a", "context_b"):
        sentence = compute.read_sentence(fields[key], state.vocab)  # as read: shown so
        ids_T = compute.parse_sentence(sentence, state.vocab)
        head = compute.one_head(state.table_VxD, ids_T, positions=positions)
        heads.append((sentence, ids_T, head))
    inputs_2xD = np.stack([head.inputs_TxD[-1] for _, _, head in heads])
    outputs_2xD = np.stack([head.outputs_TxD[-1] for _, _, head in heads])
    vectors_4xD = np.concatenate([inputs_2xD, outputs_2xD])
    labels = [
        words.f("context_input_row", side="A"),
        words.f("context_input_row", side="B"),
        words.f("context_output_row", side="A"),
        words.f("context_output_row", side="B"),
    ]
    vectors = matrix_html(
        vectors_4xD,
        labels,
        range(vectors_4xD.shape[1]),
        words=words,
        caption=words.f("context_vectors", a=clip(heads[0][0], 60), b=clip(heads[1][0], 60)),
        spec="+.4f",
        table_id="context-vectors",
    )
    figures = {}
    for letter, (text, ids_T, head) in zip("ab", heads, strict=True):
        title = words.f("context_weights", side=letter.upper(), sentence=clip(text, 40))
        alt = words.f(
            "context_weights_alt",
            side=letter.upper(),
            t=len(ids_T),
            last=words.num(float(head.weights_TxT[-1].max()), ".2f"),
        )
        figure = weights_svg([state.vocab[i] for i in ids_T], head.weights_TxT, title, words)
        figures[f"context_weights_{letter}"] = plot_html(
            figure, f"{title}. {alt}", lang, f"context-weights-{letter}"
        )
    findings = _context_findings(heads, state.vocab, words)
    if not positions:
        findings += _equivariance(state, heads, words)
    result = view(state, *findings, vectors)
    return {"context_result": result, **figures}


def period_text(period: float, words: Words) -> str:
    """Positions per turn as a learner reads them: 4 significant digits below 1,000, a grouped
    whole number from there ("54,410", not "5.441e+04")."""
    if period < 1000:
        return words.num(period, ".4g")
    return _grouped(round(period), words)


def positions_view(state: LabState | None, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    dim = compute.parse_int(fields["positions_dim"], field="width", low=2, high=MAX_POSITIONS)
    if dim % 2:
        raise LabInputError(
            "odd_width", value=dim, even=dim + 1 if dim < MAX_POSITIONS else dim - 1
        )
    length = compute.parse_int(
        fields["positions_length"], field="length", low=2, high=MAX_POSITIONS
    )
    # A position past the positions shown, or a pair past the width, is moved to the last one
    # and the page says so (the fields no longer refuse each other's values).
    typed_pos = compute.parse_int(
        fields["positions_pos"], field="position", low=0, high=MAX_POSITIONS - 1
    )
    typed_pair = compute.parse_int(
        fields["positions_pair"], field="pair", low=0, high=MAX_POSITIONS // 2 - 1
    )
    pos, pair = min(typed_pos, length - 1), min(typed_pair, dim // 2 - 1)
    notes, used = [], {}  # a moved value is also written into its field (an update: always sent)
    if pos != typed_pos:
        notes.append(words.f("positions_pos_clamped", typed=typed_pos, length=length, pos=pos))
        used["positions_pos"] = gr.update(value=str(pos))
    if pair != typed_pair:
        notes.append(words.f("positions_pair_clamped", typed=typed_pair, dim=dim, pair=pair))
        used["positions_pair"] = gr.update(value=str(pair))
    values = compute.position_pair(pos, pair, dim)
    text = words.f(
        "positions_values",
        pair=pair,
        dim=dim,
        omega=values.omega,
        period=period_text(values.period, words),
        pos=pos,
        even=2 * pair,
        odd=2 * pair + 1,
        sin=values.sin,
        cos=values.cos,
    )
    heatmap = words.f("positions_heatmap_alt", length=length, dim=dim)
    return {
        "positions_result": view(
            None, *(paragraph(note, "lab-diff") for note in notes), paragraph(text, "lab-big")
        ),
        "positions_heatmap": plot_html(
            heatmap_figure(length, dim, pos, pair, words), heatmap, lang, "positions-heatmap"
        ),
        "positions_similarity": plot_html(
            similarity_figure(length, dim, pos, words),
            words.f("positions_similarity", pos=pos),
            lang,
            "positions-similarity",
        ),
        "positions_clock": plot_html(
            clock_figure(dim, pos, pair, words),
            words.f("positions_clock", pos=pos),
            lang,
            "positions-clock",
        ),
        **used,
    }


@functools.lru_cache(maxsize=1)
def _gpt2_counts() -> tuple[int, int]:
    """GPT-2 small's parameters tied and untied, counted by the model from shapes alone."""
    from minigpt_jax.model.config import GPTConfig
    from minigpt_jax.model.gpt import count_params

    sizes = dict(vocab_size=compute.GPT2_VOCAB, n_embd=compute.GPT2_DIM, n_head=12, n_layer=12)
    sizes.update(block_size=1024, pos_encoding="learned")
    tied = count_params(GPTConfig(**sizes, tie_embeddings=True))
    return tied, count_params(GPTConfig(**sizes, tie_embeddings=False))


def semicolon_row(row_D, words: Words) -> str:
    """A row's coordinates as the article writes them: "0.2; -0.4; 0.1" ("0,2; -0,4; 0,1")."""
    return "; ".join(words.num(float(v), ".1f") for v in row_D)


def _fragment_html(row_labels, rows_RxD, caption: str, words: Words, table_id: str) -> str:
    """Rows written as the article writes them, one cell of semicolon-separated coordinates;
    a label "…" marks rows the fragment leaves out."""
    body = "".join(
        f'<tr><th scope="row">{escape(label)}</th><td>{semicolon_row(row, words)}</td></tr>'
        if row is not None
        else '<tr><th scope="row">…</th><td>…</td></tr>'
        for label, row in zip(row_labels, rows_RxD, strict=True)
    )
    return boxed(f'<table class="lab-table" id="{table_id}">{body}</table>', caption, words)


def _grouped(value: int, words: Words) -> str:
    return f"{value:,}".replace(",", words["thousands"])


def article_html(words: Words) -> str:
    """The article's [6, 9, 6] on its fragment of a three-coordinate W_E, under a heading of
    its own (above part 2's fields, which read the lesson's table)."""
    article_T = np.asarray(compute.ARTICLE_IDS, np.int32)
    fragment = _fragment_html(
        ["…", *map(str, compute.FRAGMENT_IDS[:1]), "…", *map(str, compute.FRAGMENT_IDS[1:]), "…"],
        [None, compute.FRAGMENT_RxD[0], None, compute.FRAGMENT_RxD[1], None],
        words["sizes_fragment"],
        words,
        "sizes-fragment",
    )
    article = _fragment_html(
        [f"t={t}: {i}" for t, i in enumerate(article_T)],
        compute.fragment_lookup(article_T),
        words.f("sizes_article", ids=compute.format_ids(article_T), t=len(article_T)),
        words,
        "sizes-article",
    )
    return (
        f'<div id="sizes-article-part"><h3>{escape(words["sizes_article_heading"])}</h3>'
        f"{side(fragment, op('→'), article)}"
        f"{paragraph(words['sizes_article_note'], 'lab-ok')}"
        f"<h3>{escape(words['sizes_lesson_heading'])}</h3></div>"
    )


def read_notes(read: compute.ReadIds, words: Words) -> list[str]:
    """What a list written as the lesson writes it was read as (nothing for a plain list)."""
    ids = compute.format_ids(read.ids_T)
    notes = [words.f("ids_read_batch", ids=ids, t=len(read.ids_T))] if read.batch else []
    if read.ellipsis:
        notes.append(words.f("ids_read_ellipsis", ids=ids))
    return [paragraph(note, "lab-ok") for note in notes]


def sizes_view(state: LabState | None, fields: dict, lang: str) -> dict:
    """The lesson's V, d = 512, 128 and x = tok_emb(ids) on its own table, then its h(0) with
    learned positions up to block_size 64; GPT-2's tied table (V = 50,257, d = 768). (The
    article's [6, 9, 6] is above the fields: `article_html`.)"""
    words = TEXT[lang]
    read = compute.read_ids(fields["sizes_ids"], compute.LESSON_VOCAB, limit=compute.MAX_IDS)
    ids_T = read.ids_T
    length = compute.parse_int(
        fields["sizes_length"], field="sizes_length", low=1, high=2 * compute.LESSON_BLOCK
    )
    shown, dim = min(6, compute.LESSON_DIM), compute.LESSON_DIM
    shape = f"(1, {len(ids_T)}, {dim})"
    row_labels = [f"t={t}: {i}" for t, i in enumerate(ids_T)]
    h0_1xTxD = compute.lesson_h0(ids_T)
    lookups = [
        matrix_html(
            x_1xTxD[0, :, :shown],
            row_labels,
            [*range(shown)],
            words=words,
            caption=words.f(key, ids=compute.format_ids(ids_T), shape=shape, shown=shown, dim=dim),
            spec="+.4f",
            table_id=table_id,
        )
        for key, x_1xTxD, table_id in (
            ("sizes_real_result", compute.lesson_lookup(ids_T), "sizes-real"),
            ("sizes_h0_result", h0_1xTxD, "sizes-h0"),
        )
    ]
    try:
        compute.lesson_h0(np.zeros(length, np.int32))
        beyond = words.f("sizes_fits", t=length, last=compute.LESSON_BLOCK - 1)
        beyond_cls = "lab-ok"
    except ValueError:  # the model's own check decides; the page says it in its own words
        beyond = words.f(
            "sizes_beyond", t=length, last=compute.LESSON_BLOCK - 1, block=compute.LESSON_BLOCK
        )
        beyond_cls = "lab-diff"
    tied, untied = _gpt2_counts()
    table_size = compute.embedding_table_size(compute.GPT2_VOCAB, compute.GPT2_DIM)
    lesson_size = compute.embedding_table_size(compute.LESSON_VOCAB, compute.LESSON_DIM)
    same_ids = sorted(set(compute.FRAGMENT_IDS) & set(ids_T.tolist()))
    other_table = (
        [paragraph(words.f("sizes_other_table", ids=", ".join(map(str, same_ids))), "lab-diff")]
        if same_ids
        else []
    )
    distances = matrix_html(
        compute.lesson_distances(ids_T),
        row_labels,
        [str(i) for i in ids_T],
        words=words,
        caption=words.f("sizes_distance", ids=compute.format_ids(ids_T)),
        spec=".4f",
        table_id="sizes-distance",
    )
    near_300, near_7 = compute.lesson_distances((300, 301, 7))[0, 1:]
    logits_1xTxV = compute.lesson_readout(h0_1xTxD)
    readout = matrix_html(
        logits_1xTxV[0, :, :shown],
        row_labels,
        [*range(shown)],
        words=words,
        caption=words.f(
            "sizes_readout", t=len(ids_T), vocab=compute.LESSON_VOCAB, shown=shown, dim=dim
        ),
        spec="+.4f",
        table_id="sizes-logits",
    )
    html_parts = [
        *read_notes(read, words),
        *other_table,
        lookups[0],
        paragraph(
            words.f(
                "sizes_real_note",
                vocab=_grouped(compute.LESSON_VOCAB, words),
                dim=compute.LESSON_DIM,
                params=_grouped(lesson_size, words),
            )
        ),
        distances,
        paragraph(words.f("sizes_distance_note", near=float(near_300), far=float(near_7))),
        lookups[1],
        paragraph(words.f("sizes_h0_note", block=compute.LESSON_BLOCK, dim=dim)),
        readout,
        paragraph(words.f("sizes_readout_note", vocab=compute.LESSON_VOCAB, dim=dim)),
        paragraph(beyond, beyond_cls),
        paragraph(
            words.f(
                "sizes_tying",
                vocab=_grouped(compute.GPT2_VOCAB, words),
                dim=compute.GPT2_DIM,
                table=_grouped(table_size, words),
                tied=_grouped(tied, words),
                untied=_grouped(untied, words),
            ),
            "lab-big",
        ),
    ]
    return {"sizes_result": view(None, *html_parts)}
