"""The lab page: Gradio blocks over `lab.compute`, one shared table per browser session."""

from __future__ import annotations

import dataclasses
import functools
import html
import os
import socket
import webbrowser
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from minigpt_jax.lab import compute
from minigpt_jax.lab.compute import LabInputError
from minigpt_jax.lab.text import LANGUAGES, TEXT

# The lab talks to no one but its own browser tab: no usage statistics.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # figures are rendered to PNG for the page, never shown in a window

from matplotlib.figure import Figure  # noqa: E402

MAX_POSITIONS = 512

# System fonts only: the page loads nothing from outside 127.0.0.1.
_THEME = gr.themes.Default(
    font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
)
_CSS = """
.lab-table { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 13px; }
.lab-table td, .lab-table th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
.lab-table th { background: #f3f3f3; }
.lab-table tr.hl td, .lab-table td.hl { background: #ffe08a; }
.lab-table caption { caption-side: top; text-align: left; font-weight: 600; padding: 4px 0; }
.lab-side { display: flex; gap: 24px; flex-wrap: wrap; align-items: flex-start; }
.lab-ok { color: #0a6b2d; font-weight: 600; }
.lab-diff { color: #a13d00; font-weight: 600; }
.lab-error { color: #b00020; font-weight: 600; border-left: 4px solid #b00020; padding-left: 8px; }
.lab-big { font-size: 20px; font-weight: 700; }
"""


class LabState(NamedTuple):
    """What the parts share: the table, the word of each id, the training steps taken."""

    table_VxD: np.ndarray
    vocab: tuple[str, ...]
    steps: int = 0


def initial_state() -> LabState:
    return LabState(compute.TABLE_VxD.copy(), compute.VOCAB, 0)


# ----------------------------------------------------------------------------- HTML


def _e(text) -> str:
    return html.escape(str(text))


def matrix_html(
    matrix,
    row_labels,
    col_labels,
    *,
    caption: str = "",
    rows_hl=(),
    cells_hl=(),
    fmt: str = "{:+.3f}",
) -> str:
    """An HTML table with highlighted rows and cells."""
    head = "".join(f"<th>{_e(c)}</th>" for c in ["", *col_labels])
    body = []
    for i, (label, row) in enumerate(zip(row_labels, np.asarray(matrix), strict=True)):
        cells = "".join(
            f"<td{' class=hl' if (i, j) in cells_hl else ''}>{fmt.format(float(v) + 0.0)}</td>"
            for j, v in enumerate(row)
        )
        cls = ' class="hl"' if i in rows_hl else ""
        body.append(f"<tr{cls}><th>{_e(label)}</th>{cells}</tr>")
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return f'<table class="lab-table">{cap}<tr>{head}</tr>{"".join(body)}</table>'


def _table_html(state: LabState, **kwargs) -> str:
    labels = [f"{i} {word}" for i, word in enumerate(state.vocab)]
    columns = range(state.table_VxD.shape[1])
    return matrix_html(state.table_VxD, labels, columns, **kwargs)


def _lookup_html(state: LabState, ids_T, caption: str) -> str:
    x_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    labels = [f"t={t}: {i} {state.vocab[i]}" for t, i in enumerate(ids_T)]
    return matrix_html(x_TxD, labels, range(x_TxD.shape[1]), caption=caption)


def _p(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{_e(text)}</p>' if cls else f"<p>{_e(text)}</p>"


def _error_html(error: LabInputError, lang: str) -> str:
    words = TEXT[lang]
    return _p(
        f"{words['error_prefix']}: {error.localized(lang)} ({words['kept_state']})", "lab-error"
    )


def _guarded(lang: str, n_outputs: int):
    """On bad input: leave the part's outputs and the state as they were, show the message."""

    def decorate(handler):
        @functools.wraps(handler)
        def wrapper(*args):
            try:
                return (*handler(*args), "")
            except LabInputError as error:
                return (*(gr.skip() for _ in range(n_outputs)), _error_html(error, lang))

        return wrapper

    return decorate


# ----------------------------------------------------------------------------- parts


def lookup_part(state: LabState, ids_text: str, lang: str) -> str:
    words = TEXT[lang]
    ids_T = compute.parse_ids(ids_text, len(state.vocab))
    x_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    via_one_hot = np.asarray(compute.one_hot_lookup(state.table_VxD, ids_T[None]))[0]
    parts = [
        '<div class="lab-side">',
        _table_html(state, caption=words["lookup_rows"], rows_hl=set(ids_T.tolist())),
        _lookup_html(state, ids_T, words["lookup_result"].format(t=len(ids_T), d=x_TxD.shape[1])),
        "</div>",
        _p(words["lookup_one_hot"].format(diff=float(np.abs(x_TxD - via_one_hot).max())), "lab-ok"),
    ]
    repeated = [i for i in dict.fromkeys(ids_T.tolist()) if (ids_T == i).sum() > 1]
    for i in repeated:
        positions = np.flatnonzero(ids_T == i)
        diff = float(np.abs(x_TxD[positions] - x_TxD[positions[0]]).max())
        text = words["lookup_repeat"].format(
            id=i, word=state.vocab[i], positions=", ".join(map(str, positions)), diff=diff
        )
        parts.append(_p(text, "lab-ok"))
    if not repeated:
        parts.append(_p(words["lookup_no_repeat"]))
    return "".join(parts)


def rename_part(state: LabState, ids_text: str, perm_text: str, mode: str, lang: str):
    words = TEXT[lang]
    ids_T = compute.parse_ids(ids_text, len(state.vocab))
    perm_V = compute.parse_permutation(perm_text, len(state.vocab))
    both = mode == "both"
    result = compute.rename(
        state.table_VxD, ids_T, perm_V, ids=mode in ("both", "ids"), rows=mode in ("both", "rows")
    )
    after_vocab = compute.rename_vocab(state.vocab, perm_V) if both else state.vocab
    after_state = LabState(result.renamed_table_VxD, after_vocab, state.steps)
    same = result.max_abs_diff == 0
    html_parts = [
        '<div class="lab-side">',
        _lookup_html(state, ids_T, words["rename_before"].format(ids=compute.format_ids(ids_T))),
        _lookup_html(
            after_state,
            result.renamed_ids_T,
            words["rename_after"].format(ids=compute.format_ids(result.renamed_ids_T)),
        ),
        _table_html(after_state, caption="W_E", rows_hl=set(result.renamed_ids_T.tolist())),
        "</div>",
        _p(
            words["rename_same" if same else "rename_changed"].format(diff=result.max_abs_diff),
            "lab-ok lab-big" if same else "lab-diff lab-big",
        ),
        _p(words["rename_applied" if both else "rename_not_applied"]),
    ]
    new_state = after_state if both else state
    return new_state, _table_html(new_state), "".join(html_parts)


def _edit_effect(ids_T, row: int, before_TxD, after_TxD, words: dict) -> str:
    """Which looked-up positions changed (the occurrences of `row`), and how much the others did."""
    changed = compute.changed_positions(before_TxD, after_TxD)
    if not changed:
        return words["edit_nothing"].format(row=row)
    others = [t for t in range(len(ids_T)) if ids_T[t] != row]
    other_change = float(np.abs(after_TxD[others] - before_TxD[others]).max()) if others else 0.0
    return words["edit_changed"].format(
        positions=", ".join(map(str, changed)), row=row, other=other_change
    )


def edit_part(state: LabState, ids_text, row_text, dim_text, value_text, lang: str):
    words = TEXT[lang]
    vocab_size, dim_count = state.table_VxD.shape
    ids_T = compute.parse_ids(ids_text, vocab_size)
    row = compute.parse_int(row_text, field="row", low=0, high=vocab_size - 1)
    dim = compute.parse_int(dim_text, field="dimension", low=0, high=dim_count - 1)
    value = compute.parse_number(value_text, field="value")
    edited_VxD = compute.set_coordinate(state.table_VxD, row, dim, value)
    new_state = state._replace(table_VxD=edited_VxD)
    before_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    after_TxD = np.asarray(compute.lookup(edited_VxD, ids_T[None]))[0]
    summary = words["edit_summary"].format(
        row=row, dim=dim, word=state.vocab[row], old=float(state.table_VxD[row, dim]), new=value
    )
    ids = compute.format_ids(ids_T)
    result = "".join(
        [
            _p(summary, "lab-big"),
            '<div class="lab-side">',
            _table_html(new_state, caption="W_E", cells_hl={(row, dim)}),
            _lookup_html(state, ids_T, words["rename_before"].format(ids=ids)),
            _lookup_html(new_state, ids_T, words["rename_after"].format(ids=ids)),
            "</div>",
            _p(_edit_effect(ids_T, row, before_TxD, after_TxD, words), "lab-ok"),
        ]
    )
    return new_state, _table_html(new_state), result


def _step_words() -> dict:
    return dict(input=compute.STEP_INPUT, target=compute.STEP_TARGET, rival=compute.STEP_RIVAL)


def _step_figures_html(step: compute.Step, words: dict) -> str:
    """p(target), the loss and the logit gap, before and after the step."""
    names = _step_words()
    rows = [
        [
            words["step_p"].format(**names),
            f"{100 * step.p_before:.1f}%",
            f"{100 * step.p_after:.1f}%",
        ],
        [words["step_loss"], f"{step.loss_before:.3f}", f"{step.loss_after:.3f}"],
        [words["step_gap"].format(**names), f"{step.gap_before:+.4f}", f"{step.gap_after:+.4f}"],
    ]
    head = (
        f"<tr><th></th><th>{_e(words['step_before'])}</th><th>{_e(words['step_after'])}</th></tr>"
    )
    body = "".join(
        f"<tr><th>{_e(label)}</th><td>{before}</td><td>{after}</td></tr>"
        for label, before, after in rows
    )
    return f'<table class="lab-table lab-big" id="step-figures">{head}{body}</table>'


def step_part(state: LabState, lr_text: str, lang: str):
    words = TEXT[lang]
    learning_rate = compute.parse_number(lr_text, field="learning_rate")
    input_id = state.vocab.index(compute.STEP_INPUT)
    step = compute.sgd_step(state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id, learning_rate)
    new_state = LabState(step.table_VxD, state.vocab, state.steps + 1)
    changed = ", ".join(f"{i} {state.vocab[i]}" for i in step.changed_rows) or "—"
    result = "".join(
        [
            _step_figures_html(step, words),
            _p(words["step_rows"].format(rows=changed), "lab-ok"),
            _p(words["step_count"].format(n=new_state.steps)),
            '<div class="lab-side">',
            _table_html(
                LabState(step.grad_VxD, state.vocab),
                caption=words["step_grad"],
                rows_hl=set(step.changed_rows),
                fmt="{:+.4f}",
            ),
            _table_html(new_state, caption="W_E", rows_hl=set(step.changed_rows)),
            "</div>",
        ]
    )
    return new_state, _table_html(new_state), result


def reset_part(state: LabState, lang: str):
    new_state = initial_state()
    words = TEXT[lang]
    return new_state, _table_html(new_state), _p(words["reset_done"], "lab-ok")


def _context_findings(inputs_2xD, outputs_2xD, word: str, lasts, words: dict) -> list[str]:
    """Whether the last words' inputs and outputs differ between the two sentences."""
    input_diff = float(np.abs(inputs_2xD[0] - inputs_2xD[1]).max())
    output_diff = float(np.abs(outputs_2xD[0] - outputs_2xD[1]).max())
    verdict = words["context_different_output" if output_diff > 0 else "context_same_output"]
    findings = [
        _p(
            words["context_inputs"].format(word=word, pos=lasts[0], diff=input_diff)
            + (f" ({words['context_same_input']})." if input_diff == 0 else "."),
            "lab-ok",
        ),
        _p(
            f"{words['context_outputs'].format(diff=output_diff)} ({verdict}).",
            "lab-diff lab-big" if output_diff > 0 else "lab-ok lab-big",
        ),
    ]
    if lasts[0] != lasts[1]:
        findings.append(_p(words["context_lengths"]))
    return findings


def _context_vectors_html(texts, inputs_2xD, outputs_2xD, word: str, words: dict) -> str:
    """The two sentences' inputs and outputs at their last word, one row each."""
    vectors_4xD = np.concatenate([inputs_2xD, outputs_2xD])
    labels = [
        *(words["context_input_row"].format(sentence=text) for text in texts),
        *(words["context_output_row"].format(sentence=text) for text in texts),
    ]
    return matrix_html(
        vectors_4xD,
        labels,
        range(vectors_4xD.shape[1]),
        caption=words["context_vectors"].format(word=word),
        fmt="{:+.4f}",
    )


def _attention_weights_html(vocab, heads, words: dict) -> str:
    """Each sentence's attention weights side by side, the last query's row highlighted."""
    tables = []
    for text, ids_T, head in heads:
        tokens = [vocab[i] for i in ids_T]
        tables.append(
            matrix_html(
                head.weights_TxT,
                tokens,
                tokens,
                caption=words["context_weights"].format(sentence=text),
                rows_hl={len(tokens) - 1},
                fmt="{:.3f}",
            )
        )
    return f'<div class="lab-side">{"".join(tables)}</div>'


def context_part(state: LabState, sentence_a: str, sentence_b: str, lang: str) -> str:
    words = TEXT[lang]
    heads = []
    for sentence in (sentence_a, sentence_b):
        ids_T = compute.parse_sentence(sentence, state.vocab)
        heads.append((sentence.strip(), ids_T, compute.one_head(state.table_VxD, ids_T)))
    texts = [text for text, _, _ in heads]
    lasts = [len(ids_T) - 1 for _, ids_T, _ in heads]
    inputs_2xD = np.stack([head.inputs_TxD[-1] for _, _, head in heads])  # at the last word
    outputs_2xD = np.stack([head.outputs_TxD[-1] for _, _, head in heads])
    word = state.vocab[heads[0][1][-1]]
    return "".join(
        [
            *_context_findings(inputs_2xD, outputs_2xD, word, lasts, words),
            _context_vectors_html(texts, inputs_2xD, outputs_2xD, word, words),
            _attention_weights_html(state.vocab, heads, words),
        ]
    )


def equal_part(state: LabState, sentence_a: str, sentence_b: str, lang: str):
    return sentence_a, context_part(state, sentence_a, sentence_a, lang)


def _heatmap_figure(length: int, dim: int, pos: int, pair: int, words: dict) -> Figure:
    """The whole position table, the chosen (sin, cos) pair at `pos` outlined."""
    table_TxD = np.asarray(compute.sinusoidal_positions(length, dim))
    figure = Figure(figsize=(5.0, 3.6), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(
        table_TxD, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest"
    )
    figure.colorbar(image, ax=ax)
    ax.add_patch(matplotlib.patches.Rectangle((2 * pair - 0.5, pos - 0.5), 2, 1, fill=False, lw=2))
    ax.set_xlabel(words["positions_dimension"])
    ax.set_ylabel(words["positions_position"])
    ax.set_title(words["positions_heatmap"])
    return figure


def _similarity_figure(length: int, dim: int, pos: int, words: dict) -> Figure:
    """P[pos] · P[pos + k] against the offset k."""
    similarity_TxT = compute.position_similarity(length, dim)
    figure = Figure(figsize=(5.0, 3.6), layout="constrained")
    ax = figure.subplots()
    offsets = np.arange(length) - pos
    ax.plot(offsets, similarity_TxT[pos], marker=".")
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(words["positions_offset"])
    ax.set_ylabel(words["positions_dot"])
    ax.set_title(words["positions_similarity"].format(pos=pos))
    return figure


def _clock_figure(dim: int, pos: int, pair: int, words: dict) -> Figure:
    """The first pairs (and the chosen one) at `pos` as clock hands, the chosen one thick."""
    hands_Px2 = compute.clock_hands(pos, dim)
    figure = Figure(figsize=(3.8, 3.6), layout="constrained")
    ax = figure.subplots()
    ax.add_patch(matplotlib.patches.Circle((0, 0), 1, fill=False, color="grey"))
    shown = sorted({*range(min(len(hands_Px2), 6)), pair})
    for i in shown:
        sin, cos = hands_Px2[i]
        length_i = 1.0 - 0.12 * shown.index(i)  # nested hands stay distinguishable
        ax.plot(
            [0, length_i * sin], [0, length_i * cos], lw=4 if i == pair else 1.5, label=f"i={i}"
        )
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(-1.1, 1.1)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(words["positions_clock"].format(pos=pos), fontsize=9)
    return figure


def positions_part(dim_text, pos_text, pair_text, length_text, lang: str):
    words = TEXT[lang]
    dim = compute.parse_int(dim_text, field="width", low=2, high=MAX_POSITIONS)
    if dim % 2:
        raise LabInputError(
            "odd_width", value=dim, even=dim + 1 if dim < MAX_POSITIONS else dim - 1
        )
    length = compute.parse_int(length_text, field="length", low=2, high=MAX_POSITIONS)
    pos = compute.parse_int(pos_text, field="position", low=0, high=length - 1)
    pair = compute.parse_int(pair_text, field="pair", low=0, high=dim // 2 - 1)
    values = compute.position_pair(pos, pair, dim)
    text = words["positions_values"].format(
        pair=pair,
        dim=dim,
        omega=values.omega,
        period=values.period,
        pos=pos,
        even=2 * pair,
        odd=2 * pair + 1,
        sin=values.sin,
        cos=values.cos,
    )
    return (
        _p(text, "lab-big"),
        _heatmap_figure(length, dim, pos, pair, words),
        _similarity_figure(length, dim, pos, words),
        _clock_figure(dim, pos, pair, words),
    )


# ----------------------------------------------------------------------------- the page


def _dashed(key: str) -> str:
    """A component's elem_id: its key with dashes ("lookup_ids" -> "lookup-ids")."""
    return key.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Field:
    """A textbox labelled TEXT[lang][key]."""

    key: str
    default: str

    def make(self, words: dict):
        return gr.Textbox(self.default, label=words[self.key], elem_id=_dashed(self.key))


@dataclasses.dataclass(frozen=True)
class Choice:
    """Radio buttons labelled TEXT[lang][key]; each option is (its text key, its value)."""

    key: str
    options: tuple[tuple[str, str], ...]
    default: str

    def make(self, words: dict):
        options = [(words[text], value) for text, value in self.options]
        return gr.Radio(
            options, value=self.default, label=words[self.key], elem_id=_dashed(self.key)
        )


@dataclasses.dataclass(frozen=True)
class Button:
    """A button reading TEXT[lang][key]."""

    key: str
    primary: bool = True
    default = None  # a button has no value of its own

    def make(self, words: dict):
        variant = "primary" if self.primary else "secondary"
        return gr.Button(words[self.key], variant=variant, elem_id=_dashed(self.key))


class Click(NamedTuple):
    """Clicking `button` runs `handler(*inputs, lang=lang)`, which fills `outputs`.

    Inputs and outputs name components: "state", "table", a widget's key, "result", a plot's key;
    the part's message always comes last in the outputs, where `_guarded` writes it.
    """

    button: str
    handler: Callable
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class Part(NamedTuple):
    """One part of the page: its words are TEXT[lang]["<name>_heading"] (and "<name>_explain")."""

    name: str  # elem_ids part-<name>, <name>-message, <name>-result
    layout: tuple  # widgets in order: a tuple of widgets is one gr.Row, a bare widget stands alone
    clicks: tuple[Click, ...]
    explain: bool = False  # a paragraph under the heading
    heading_args: Callable[[], dict] | None = None  # fills the heading's {placeholders}
    above: Callable[[dict], str] | None = None  # HTML of the words, above the widgets
    plots: tuple[str, ...] = ()  # gr.Plot keys, in a row under the result
    shown_at_start: bool = False  # the first click's outputs, for the widgets' defaults


def _output_weights_html(words: dict) -> str:
    return matrix_html(
        compute.OUTPUT_WEIGHTS_2xD,
        [f"w_{compute.STEP_TARGET}", f"w_{compute.STEP_RIVAL}"],
        range(compute.OUTPUT_WEIGHTS_2xD.shape[1]),
        caption=words["step_outputs"],
    )


_TABLE_OUTPUTS = ("state", "table", "result")  # the outputs of a part that changes the shared table

# The page's parts in order. A new part is one row here, its words under its name in text.py.
PARTS = (
    Part(
        "lookup",
        ((Field("lookup_ids", "[0, 1, 0]"), Button("lookup_button")),),
        (Click("lookup_button", lookup_part, ("state", "lookup_ids"), ("result",)),),
        shown_at_start=True,
    ),
    Part(
        "rename",
        (
            (
                Field("rename_ids", "[0, 1, 2]"),
                Field("rename_perm", "[5, 3, 0, 1, 2, 4]"),
                Choice(
                    "rename_mode",
                    (("mode_both", "both"), ("mode_ids", "ids"), ("mode_rows", "rows")),
                    "both",
                ),
            ),
            Button("rename_button"),
        ),
        (
            Click(
                "rename_button",
                rename_part,
                ("state", "rename_ids", "rename_perm", "rename_mode"),
                _TABLE_OUTPUTS,
            ),
        ),
    ),
    Part(
        "edit",
        (
            (
                Field("edit_ids", "[0, 1, 2, 1]"),
                Field("edit_row", "1"),
                Field("edit_dim", "3"),
                Field("edit_value", "0.9"),
            ),
            Button("edit_button"),
        ),
        (
            Click(
                "edit_button",
                edit_part,
                ("state", "edit_ids", "edit_row", "edit_dim", "edit_value"),
                _TABLE_OUTPUTS,
            ),
        ),
    ),
    Part(
        "step",
        (
            (
                Field("step_lr", str(compute.LEARNING_RATE)),
                Button("step_button"),
                Button("reset_button", primary=False),
            ),
        ),
        (
            Click("step_button", step_part, ("state", "step_lr"), _TABLE_OUTPUTS),
            Click("reset_button", reset_part, ("state",), _TABLE_OUTPUTS),
        ),
        explain=True,
        heading_args=_step_words,
        above=_output_weights_html,
    ),
    Part(
        "context",
        (
            (Field("context_a", compute.SENTENCES[0]), Field("context_b", compute.SENTENCES[1])),
            (Button("context_button"), Button("equal_button", primary=False)),
        ),
        (
            Click("context_button", context_part, ("state", "context_a", "context_b"), ("result",)),
            Click(
                "equal_button",
                equal_part,
                ("state", "context_a", "context_b"),
                ("context_b", "result"),
            ),
        ),
        explain=True,
        shown_at_start=True,
    ),
    Part(
        "positions",
        (
            (
                Field("positions_dim", "16"),
                Field("positions_pos", "5"),
                Field("positions_pair", "1"),
                Field("positions_length", "64"),
                Button("positions_button"),
            ),
        ),
        (
            Click(
                "positions_button",
                positions_part,
                ("positions_dim", "positions_pos", "positions_pair", "positions_length"),
                ("result", "positions_heatmap", "positions_similarity", "positions_clock"),
            ),
        ),
        plots=("positions_heatmap", "positions_similarity", "positions_clock"),
        shown_at_start=True,
    ),
)


def _heading(part: Part, words: dict) -> str:
    heading = words[f"{part.name}_heading"]
    if part.heading_args:
        heading = heading.format(**part.heading_args())
    explain = f"\n\n{words[f'{part.name}_explain']}" if part.explain else ""
    return f"## {heading}{explain}"


def _tupled(click: Click, lang: str) -> Callable:
    """The click's handler in `lang`, returning a tuple of its outputs even when there is one."""
    handler = functools.partial(click.handler, lang=lang)
    if len(click.outputs) == 1:
        return lambda *args: (handler(*args),)
    return handler


def _shown_at_start(part: Part, start: LabState, lang: str) -> dict:
    """The first click's outputs by name, for the start state and the widgets' defaults."""
    if not part.shown_at_start:
        return {}
    first = part.clicks[0]
    defaults = {widget.key: widget.default for widget in _widgets(part.layout)}
    inputs = [start if name == "state" else defaults[name] for name in first.inputs]
    return dict(zip(first.outputs, _tupled(first, lang)(*inputs), strict=True))


def _widgets(layout: tuple):
    """The layout's widgets in order."""
    for item in layout:
        yield from item if isinstance(item, tuple) else (item,)


def _build_widgets(layout: tuple, words: dict) -> dict:
    """The layout's widgets by key, each tuple of them in a gr.Row."""
    widgets = {}
    for item in layout:
        if isinstance(item, tuple):
            with gr.Row():
                widgets.update((widget.key, widget.make(words)) for widget in item)
        else:
            widgets[item.key] = item.make(words)
    return widgets


def _build_part(part: Part, shared: dict, start: LabState, lang: str) -> None:
    """The part's group under the components in `shared` ("state", "table"), then its events."""
    words = TEXT[lang]
    components = dict(shared)
    with gr.Group(elem_id=f"part-{part.name}"):
        gr.Markdown(_heading(part, words))
        if part.above:
            gr.HTML(part.above(words))
        components.update(_build_widgets(part.layout, words))
        message = gr.HTML("", elem_id=f"{part.name}-message")
        shown = _shown_at_start(part, start, lang)
        components["result"] = gr.HTML(shown.get("result", ""), elem_id=f"{part.name}-result")
        if part.plots:
            with gr.Row():
                for key in part.plots:
                    components[key] = gr.Plot(shown[key], elem_id=_dashed(key), show_label=False)
    for click in part.clicks:
        components[click.button].click(
            _guarded(lang, len(click.outputs))(_tupled(click, lang)),
            [components[name] for name in click.inputs],
            [*(components[name] for name in click.outputs), message],
        )


def build(lang: str = "en") -> gr.Blocks:
    """The lab's Blocks in `lang` (one of LANGUAGES): the shared table, then every part in PARTS."""
    if lang not in LANGUAGES:
        raise ValueError(f"--lang must be one of {', '.join(LANGUAGES)}, got {lang!r}.")
    words = TEXT[lang]
    start = initial_state()
    with gr.Blocks(title=words["title"], analytics_enabled=False) as demo:
        state = gr.State(start)
        gr.Markdown(f"# {words['title']}\n\n{words['intro']}")
        gr.Markdown(f"**{words['table_heading']}**")
        table = gr.HTML(_table_html(start), elem_id="table")
        for part in PARTS:
            _build_part(part, dict(state=state, table=table), start, lang)
    return demo


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(*, port: int | None = None, open_browser: bool = False, lang: str = "en") -> None:
    """Serve the lab on 127.0.0.1 until interrupted; prints the URL first."""
    demo = build(lang)
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/"
    demo.queue(default_concurrency_limit=4)
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        quiet=True,
        prevent_thread_lock=True,
        theme=_THEME,
        css=_CSS,
        footer_links=[],
    )
    print(f"minigpt-jax lab: {url} (Ctrl-C stops it)", flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        demo.block_thread()
    finally:
        demo.close()
