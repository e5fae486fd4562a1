"""The lab page: Gradio blocks over `lab.compute`, one shared table per browser tab.

Every part is a row of `PARTS`: its widgets, a *view* (what it shows, recomputed from the shared
table and its widgets) and its *events* (an action that may change the table, then the views).
When an action changes the table, every part that reads the table is rendered again in the same
event, so no part shows an older table than the one on screen. The events that touch the table
run one at a time (one Gradio concurrency group), and the table lives on the server (`gr.State`),
so two clicks in the same instant are applied one after the other. A copy goes to the browser's
storage (`gr.BrowserState`), from which a reload restores it.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import functools
import hashlib
import html
import io
import itertools
import json
import logging
import math
import os
import socket
import textwrap
import threading
import webbrowser
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from minigpt_jax.lab import compute, svg
from minigpt_jax.lab.compute import LabInputError
from minigpt_jax.lab.text import LANGUAGES, TEXT, Words

# The lab talks to no one but its own browser tab: no usage statistics.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import matplotlib  # noqa: E402
import matplotlib.patches  # noqa: E402
import matplotlib.ticker  # noqa: E402

matplotlib.use("Agg")  # figures are rendered to PNG for the page, never shown in a window

from matplotlib.figure import Figure  # noqa: E402

log = logging.getLogger(__name__)

MAX_POSITIONS = compute.MAX_POSITIONS
STORAGE_KEY = "minigpt-jax-lab-table"
RUN_FRAMES = 20  # chart updates during one run of N steps
SLIDER_RANGE = 2.0  # the slider spans ±2 (wider when the coordinate is already beyond)

# System fonts only: the page loads nothing from outside 127.0.0.1.
_THEME = gr.themes.Default(
    font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
)
_CSS = """
.lab-box { max-width: 100%; min-width: 0; }
.lab-caption { font-weight: 600; font-size: 13px; padding: 4px 0; overflow-wrap: anywhere; }
.lab-scroll { overflow-x: auto; max-width: 100%; -webkit-overflow-scrolling: touch; }
.lab-scroll.lab-overflows { border-right: 4px solid #6b7280; }
.lab-scroll.lab-overflows::before { content: attr(data-hint); display: block; position: sticky;
  left: 0; font-size: 12px; color: #374151; white-space: normal; }
.lab-table { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 13px;
  white-space: nowrap; }
.lab-table td, .lab-table th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
.lab-table th { background: #f3f3f3; }
.lab-table th[scope=row] { text-align: left; }
.lab-table tr.hl td, .lab-table td.hl { background: #ffe08a; }
.lab-table td.one { background: #cfe3ff; font-weight: 700; }
.lab-figures th[scope=row] { white-space: normal; min-width: 5em; max-width: 12em; }
.lab-side { display: flex; gap: 16px; flex-wrap: wrap; align-items: center; }
.lab-side > * { min-width: 0; max-width: 100%; }
.lab-op { font-size: 22px; font-weight: 700; }
.lab-ok { color: #0a6b2d; font-weight: 600; }
.lab-diff { color: #a13d00; font-weight: 600; }
.lab-error { color: #b00020; font-weight: 600; border-left: 4px solid #b00020; padding-left: 8px; }
.lab-big { font-size: 18px; font-weight: 700; }
.lab-explain { font-size: 14px; color: #333; }
.lab-figure { max-width: 100%; height: auto; display: block; }
.lab-plots { flex-wrap: wrap !important; }
.lab-plots > * { flex: 1 1 300px !important; min-width: min(300px, 100%) !important; }
button.lab-button { border: 2px solid #4b5563 !important; border-radius: 8px !important;
  box-shadow: 0 1px 2px rgba(0,0,0,.25) !important; font-weight: 600 !important; }
button.lab-button.secondary { background: #ffffff !important; color: #1f2937 !important; }
button.lab-button:hover { filter: brightness(0.95); }
#edit-slider input[type=number] { display: none; }
:focus-visible { outline: 3px solid #1d4ed8 !important; outline-offset: 2px; }
@media (max-width: 600px) {
  .lab-table { font-size: 11px; }
  .lab-table td, .lab-table th { padding: 1px 3px; }
  .lab-table th[scope=row] { white-space: normal; max-width: 7.5em; }
  .lab-big { font-size: 15px; }
}
"""


# ----------------------------------------------------------------------------- the shared state


class LabState(NamedTuple):
    """What the parts share: the table, the word of each id, the steps taken and their record.

    `history` holds (steps taken, p(target), loss) after each step; `last_run` the figures before
    the last run of steps while the table is still what that run left (None after any other
    change)."""

    table_VxD: np.ndarray
    vocab: tuple[str, ...]
    steps: int = 0
    history: tuple[tuple[int, float, float], ...] = ()
    last_run: dict | None = None


def initial_state() -> LabState:
    return LabState(compute.TABLE_VxD.copy(), compute.VOCAB, 0)


def table_key(state: LabState) -> str:
    """A short fingerprint of the table and its vocabulary: every view carries the one it used."""
    digest = hashlib.sha1(np.ascontiguousarray(state.table_VxD, np.float32).tobytes())
    digest.update("|".join(state.vocab).encode())
    return digest.hexdigest()[:12]


def to_storage(state: LabState) -> dict:
    """The state as JSON for the browser's storage (float32 values round-trip exactly)."""
    return {
        "table": np.asarray(state.table_VxD, np.float32).tolist(),
        "vocab": list(state.vocab),
        "steps": state.steps,
        "history": [list(point) for point in state.history],
    }


def from_storage(stored: Any) -> LabState | None:
    """The state stored by `to_storage`, or None when it is missing or not a valid lab table."""
    try:
        table_VxD = np.asarray(stored["table"], np.float32)
        vocab = tuple(stored["vocab"])
        steps = int(stored["steps"])
        history = tuple((int(s), float(p), float(loss)) for s, p, loss in stored["history"])
    except (KeyError, TypeError, ValueError):
        return None
    if (
        table_VxD.shape != compute.TABLE_VxD.shape
        or not np.isfinite(table_VxD).all()
        or sorted(vocab) != sorted(compute.VOCAB)
        or steps < 0
    ):
        return None
    return LabState(table_VxD, vocab, steps, history[-10 * compute.MAX_STEPS :])


# ----------------------------------------------------------------------------- HTML


def _e(text) -> str:
    return html.escape(str(text))


def _boxed(table: str, caption: str, words: Words) -> str:
    """A table under its caption (which wraps at the screen's width), in a wrapper that scrolls
    sideways when the table is wider than the screen; the page's script marks such a wrapper
    (class lab-overflows), which then shows `scroll_hint` above the table."""
    cap = f'<div class="lab-caption">{_e(caption)}</div>' if caption else ""
    hint = _e(words["scroll_hint"])
    return (
        f'<div class="lab-box">{cap}<div class="lab-scroll" tabindex="0" data-hint="{hint}">'
        f"{table}</div></div>"
    )


def matrix_html(
    matrix,
    row_labels,
    col_labels,
    *,
    words: Words = TEXT["en"],
    caption: str = "",
    rows_hl=(),
    cells_hl=(),
    spec: str = "+.3f",
    cls: str = "",
    table_id: str = "",
) -> str:
    """An HTML table of numbers in `words`' language, highlighted rows and cells, its caption
    above it."""
    head = "".join(f"<th>{_e(c)}</th>" for c in ["", *col_labels])
    body = []
    for i, (label, row) in enumerate(zip(row_labels, np.asarray(matrix), strict=True)):
        cells = "".join(
            f"<td{' class=hl' if (i, j) in cells_hl else ''}>{words.num(float(v), spec)}</td>"
            for j, v in enumerate(row)
        )
        row_cls = ' class="hl"' if i in rows_hl else ""
        body.append(f'<tr{row_cls}><th scope="row">{_e(label)}</th>{cells}</tr>')
    ident = f' id="{table_id}"' if table_id else ""
    table = f'<table class="lab-table {cls}"{ident}><tr>{head}</tr>{"".join(body)}</table>'
    return _boxed(table, caption, words)


def _one_hot_html(one_hot_TxV, vocab, caption: str, words: Words) -> str:
    head = f"<th></th>{''.join(f'<th>{v}</th>' for v in range(len(vocab)))}"
    body = "".join(
        f'<tr><th scope="row">t={t}</th>'
        + "".join(
            f'<td class="one">{value:g}</td>' if value else f"<td>{value:g}</td>" for value in row
        )
        + "</tr>"
        for t, row in enumerate(np.asarray(one_hot_TxV))
    )
    table = f'<table class="lab-table" id="one-hot"><tr>{head}</tr>{body}</table>'
    return _boxed(table, caption, words)


def _labels(state: LabState) -> list[str]:
    return [f"{i} {word}" for i, word in enumerate(state.vocab)]


def _table_html(state: LabState, words: Words, **kwargs) -> str:
    return matrix_html(
        state.table_VxD, _labels(state), range(state.table_VxD.shape[1]), words=words, **kwargs
    )


def _shared_table_html(state: LabState, words: Words) -> str:
    """The table on top of the page, with its fingerprint and exact values for the tests."""
    exact = html.escape(str(to_storage(state)["table"]), quote=True)
    return (
        f'<div class="lab-view" data-w="{table_key(state)}" data-table="{exact}">'
        f"{_table_html(state, words, table_id='shared-table')}</div>"
    )


def _lookup_html(
    state: LabState, ids_T, caption: str, words: Words, rows_hl=(), table_id: str = ""
) -> str:
    x_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    labels = [f"t={t}: {i} {state.vocab[i]}" for t, i in enumerate(ids_T)]
    return matrix_html(
        x_TxD,
        labels,
        range(x_TxD.shape[1]),
        words=words,
        caption=caption,
        rows_hl=rows_hl,
        table_id=table_id,
    )


def _p(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{_e(text)}</p>' if cls else f"<p>{_e(text)}</p>"


def _view(state: LabState | None, *parts: str) -> str:
    """A view's HTML, marked with the fingerprint of the table it was computed from."""
    key = f' data-w="{table_key(state)}"' if state is not None else ""
    return f'<div class="lab-view"{key}>{"".join(parts)}</div>'


def _error_html(error: LabInputError, lang: str) -> str:
    words = TEXT[lang]
    return _p(
        f"{words['error_prefix']}: {error.localized(lang)} ({words['kept_state']})", "lab-error"
    )


def _unexpected_html(error: Exception, lang: str) -> str:
    text = TEXT[lang].f("unexpected_error", error=f"{type(error).__name__}: {error}"[:300])
    return _p(text, "lab-error")


def _side(*tables: str) -> str:
    return f'<div class="lab-side">{"".join(tables)}</div>'


def _op(symbol: str) -> str:
    return f'<span class="lab-op" aria-hidden="true">{_e(symbol)}</span>'


# ----------------------------------------------------------------------------- plots
# Each figure goes to the page as an SVG <img> with alt text in the page's language (its text
# stays text, so the tests read the axes), its tick labels in that language's numbers.


def _clip(text: str, limit: int) -> str:
    """A quoted text cut to `limit` characters (… marks the cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _wrapped(title: str, width: int = 42) -> str:
    return "\n".join(textwrap.wrap(title, width))


def _figure(width: float = 4.2, height: float = 3.4) -> Figure:
    """A figure about as wide as a phone's screen, so the page does not shrink its text."""
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    figure.patch.set_facecolor("white")
    return figure


class _Ticks(matplotlib.ticker.ScalarFormatter):
    """Matplotlib's tick labels with the page's decimal separator (no locale: threads share it)."""

    def __init__(self, lang: str):
        super().__init__(useOffset=False)
        self.lang = lang

    def __call__(self, x, pos=None):
        text = super().__call__(x, pos).replace("\N{MINUS SIGN}", "-")
        return text.replace(".", ",") if self.lang == "es" else text


def _localize(figure: Figure, lang: str) -> None:
    """Every numeric axis of the figure (colour bars too) in `lang`'s numbers."""
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if isinstance(axis.get_major_formatter(), matplotlib.ticker.ScalarFormatter):
                axis.set_major_formatter(_Ticks(lang))


def plot_html(figure: Figure | str, alt: str, lang: str, elem_id: str = "") -> str:
    """The figure (matplotlib's, or SVG text from `lab.svg`) as an SVG image with its alt
    text; a matplotlib figure is cleared afterwards."""
    if isinstance(figure, str):
        data = base64.b64encode(figure.encode()).decode()
    else:
        _localize(figure, lang)
        buffer = io.BytesIO()
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "lab"}):
            figure.savefig(buffer, format="svg")
        figure.clear()
        data = base64.b64encode(buffer.getvalue()).decode()
    ident = f' id="{elem_id}-img"' if elem_id else ""
    return (
        f'<div class="lab-plot"><img{ident} class="lab-figure" alt="{_e(alt)}" '
        f'src="data:image/svg+xml;base64,{data}"></div>'
    )


def _weights_svg(tokens, weights_TxT, title: str, words: Words) -> str:
    """Attention weights as a heatmap (row: query, column: key); words label the axes up to 10
    tokens, position numbers (every k-th) beyond."""
    long = len(tokens) > 10
    labels = [str(t) for t in range(len(tokens))] if long else list(tokens)
    return svg.heatmap(
        weights_TxT,
        labels,
        labels,
        title=title,
        scheme="blues",
        low=0.0,
        high=1.0,
        num=words.num,
        cell_spec=".2f",
        xlabel=words["context_key_position"] if long else "",
        ylabel=words["context_query_position"] if long else "",
    )


def _points_svg(state: LabState, points_Vx2, words: Words) -> str:
    low, high = float(points_Vx2.min()), float(points_Vx2.max())
    pad = max(0.35, 0.15 * (high - low))
    return svg.scatter(
        points_Vx2,
        [f"{i} {word}" for i, word in enumerate(state.vocab)],
        title=words["map_points"],
        xlabel=words.f("map_axis", k=1),
        ylabel=words.f("map_axis", k=2),
        lim=(min(low, -1.0) - pad, max(high, 1.0) + pad),
        num=words.num,
    )


def _cosine_svg(state: LabState, cosine_VxV, words: Words) -> str:
    return svg.heatmap(
        cosine_VxV,
        list(state.vocab),
        list(state.vocab),
        title=words["map_cosine"],
        scheme="diverging",
        low=-1.0,
        high=1.0,
        num=words.num,
        cell_spec="+.2f",
    )


def _chart_svg(points, words: Words) -> str:
    """p(target) and the loss after each step taken (a marker per point: step 0 shows, too)."""
    steps = [s for s, _, _ in points]
    return svg.lines(
        [
            (words.f("step_p", **_step_words()), steps, [p for _, p, _ in points]),
            (words["step_loss"], steps, [loss for _, _, loss in points]),
        ],
        title=words["step_chart"],
        xlabel=words["step_axis"],
        num=words.num,
    )


def _heatmap_figure(length: int, dim: int, pos: int, pair: int, words: Words) -> Figure:
    """The whole position table, the chosen (sin, cos) pair at `pos` outlined."""
    table_TxD = np.asarray(compute.sinusoidal_positions(length, dim))
    figure = _figure()
    ax = figure.subplots()
    image = ax.imshow(
        table_TxD, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest"
    )
    figure.colorbar(image, ax=ax)
    ax.add_patch(matplotlib.patches.Rectangle((2 * pair - 0.5, pos - 0.5), 2, 1, fill=False, lw=2))
    ax.set_xlabel(_wrapped(words["positions_dimension"]), fontsize=9)
    ax.set_ylabel(words["positions_position"], fontsize=9)
    ax.set_title(_wrapped(words["positions_heatmap"]), fontsize=10)
    return figure


def _similarity_figure(length: int, dim: int, pos: int, words: Words) -> Figure:
    """P[pos] · P[pos + k] against the offset k."""
    similarity_TxT = compute.position_similarity(length, dim)
    figure = _figure()
    ax = figure.subplots()
    offsets = np.arange(length) - pos
    ax.plot(offsets, similarity_TxT[pos], marker=".")
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(words["positions_offset"], fontsize=9)
    ax.set_ylabel(words["positions_dot"], fontsize=9)
    ax.set_title(_wrapped(words.f("positions_similarity", pos=pos)), fontsize=10)
    return figure


def _clock_figure(dim: int, pos: int, pair: int, words: Words) -> Figure:
    """The first pairs (and the chosen one) at `pos` as clock hands, the chosen one thick."""
    hands_Px2 = compute.clock_hands(pos, dim)
    figure = _figure(4.2, 3.8)
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
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(_wrapped(words.f("positions_clock", pos=pos), 38), fontsize=10)
    return figure


# ----------------------------------------------------------------------------- the views
# view(state, fields, lang) -> {output key: value}; fields holds every widget's value by key.


def _number(fields: dict, key: str, lang: str, **limits) -> float:
    return compute.parse_number(fields[key], field=key, decimal_comma=lang == "es", **limits)


def lookup_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    vocab_size = len(state.vocab)
    ids_T = compute.parse_ids(fields["lookup_ids"], vocab_size)
    x_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    one_hot_TxV = compute.one_hot(ids_T, vocab_size)
    via_one_hot = np.asarray(compute.one_hot_lookup(state.table_VxD, ids_T[None]))[0]
    parts = [
        _side(
            _one_hot_html(one_hot_TxV, state.vocab, words["lookup_one_hot_matrix"], words),
            _op("·"),
            _table_html(state, words, caption=words["lookup_rows"], rows_hl=set(ids_T.tolist())),
            _op("="),
            _lookup_html(
                state, ids_T, words.f("lookup_result", t=len(ids_T), d=x_TxD.shape[1]), words
            ),
        ),
        _p(words.f("lookup_one_hot", diff=float(np.abs(x_TxD - via_one_hot).max())), "lab-ok"),
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
        parts.append(_p(text, "lab-ok"))
    if not repeated:
        parts.append(_p(words["lookup_no_repeat"]))
    return {"lookup_result": _view(state, *parts)}


def _rename_inputs(state: LabState, fields: dict):
    ids_T = compute.parse_ids(fields["rename_ids"], len(state.vocab))
    perm_V = compute.parse_permutation(fields["rename_perm"], len(state.vocab))
    return ids_T, perm_V, fields["rename_mode"]


def rename_view(state: LabState, fields: dict, lang: str) -> dict:
    """What renaming by π would do to the lookup, on the current table (a preview)."""
    words = TEXT[lang]
    ids_T, perm_V, mode = _rename_inputs(state, fields)
    result = compute.rename(
        state.table_VxD, ids_T, perm_V, ids=mode in ("both", "ids"), rows=mode in ("both", "rows")
    )
    after_vocab = compute.rename_vocab(state.vocab, perm_V) if mode == "both" else state.vocab
    after_state = LabState(result.renamed_table_VxD, after_vocab)
    same = result.max_abs_diff == 0
    html_parts = [
        _p(words["rename_preview"]),
        _side(
            _lookup_html(
                state, ids_T, words.f("rename_before", ids=compute.format_ids(ids_T)), words
            ),
            _lookup_html(
                after_state,
                result.renamed_ids_T,
                words.f("rename_after", ids=compute.format_ids(result.renamed_ids_T)),
                words,
            ),
            _table_html(
                after_state,
                words,
                caption=words["rename_table_after"],
                rows_hl=set(result.renamed_ids_T.tolist()),
            ),
        ),
        _p(
            words.f("rename_same" if same else "rename_changed", diff=result.max_abs_diff),
            "lab-ok lab-big" if same else "lab-diff lab-big",
        ),
        _p(words["rename_will_apply" if mode == "both" else "rename_what_if"]),
    ]
    return {"rename_result": _view(state, *html_parts)}


def _edit_cell(state: LabState, fields: dict) -> tuple[int, int]:
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
    ids_T = compute.parse_ids(fields["edit_ids"], len(state.vocab))
    row, dim = _edit_cell(state, fields)
    occurrences = set(np.flatnonzero(ids_T == row).tolist())
    value = float(state.table_VxD[row, dim])
    ids = compute.format_ids(ids_T)
    found = ", ".join(map(str, sorted(occurrences)))
    html_parts = [
        _side(
            _table_html(state, words, caption="W_E", cells_hl={(row, dim)}),
            _lookup_html(
                state, ids_T, words.f("edit_lookup", ids=ids, row=row), words, rows_hl=occurrences
            ),
        ),
        _p(
            words.f(
                "edit_occurs" if occurrences else "edit_absent",
                row=row,
                word=state.vocab[row],
                positions=found,
            )
        ),
    ]
    if row == state.vocab.index(compute.STEP_INPUT) and dim >= 3:
        html_parts.append(_p(words.f("edit_no_effect", dim=dim, target=compute.STEP_TARGET)))
    low, high = min(-SLIDER_RANGE, math.floor(value)), max(SLIDER_RANGE, math.ceil(value))
    label = words.f("edit_slider", row=row, dim=dim, word=state.vocab[row])
    return {
        "edit_result": _view(state, *html_parts),
        "edit_slider": gr.update(value=shortest(value), minimum=low, maximum=high, label=label),
        "edit_row": gr.update(choices=[(name, str(i)) for i, name in enumerate(_labels(state))]),
    }


def _step_words() -> dict:
    return dict(input=compute.STEP_INPUT, target=compute.STEP_TARGET, rival=compute.STEP_RIVAL)


def _stats(state: LabState) -> compute.Stats:
    input_id = state.vocab.index(compute.STEP_INPUT)
    return compute.step_stats(state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id)


def _figures_html(columns: list[tuple[str, compute.Stats]], words: Words) -> str:
    """p(target), the loss and the logit gap, one column per table (labels wrap on phones)."""
    names = _step_words()
    rows = [
        (words.f("step_p", **names), lambda s: words.num(s.p, ".1%")),
        (words["step_loss"], lambda s: words.num(s.loss, ".3f")),
        (words.f("step_gap", **names), lambda s: words.num(s.gap, "+.4f")),
    ]
    head = "<tr><th></th>" + "".join(f"<th>{_e(name)}</th>" for name, _ in columns) + "</tr>"
    body = "".join(
        f'<tr><th scope="row">{_e(label)}</th>'
        + "".join(f"<td>{show(stats)}</td>" for _, stats in columns)
        + "</tr>"
        for label, show in rows
    )
    table = f'<table class="lab-table lab-big lab-figures" id="step-figures">{head}{body}</table>'
    return _boxed(table, "", words)


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
        **_step_words(),
    )
    return plot_html(_chart_svg(points, words), alt, words.lang, "step-chart")


def _applied_html(state: LabState, run: dict, words: Words) -> str:
    """The gradient the run's first step subtracted and each changed row before → after."""
    grad_VxD = np.asarray(run["grad"], np.float32)
    grad_rows = set(np.flatnonzero(np.abs(grad_VxD).max(1) > 0).tolist())
    parts = [
        matrix_html(
            grad_VxD,
            _labels(state),
            range(grad_VxD.shape[1]),
            words=words,
            caption=words.f("step_grad_applied", lr=run["lr"])
            if run["n"] == 1
            else words.f("steps_grad_applied", lr=run["lr"], n=run["n"]),
            rows_hl=grad_rows,
            spec="+.4f",
            table_id="step-grad",
        )
    ]
    for i in run["rows"]:
        before_D = np.asarray(run["before"][i], np.float32)
        rows = [before_D, state.table_VxD[i] - before_D, state.table_VxD[i]]
        labels = [words["step_row_before"], words["step_row_change"], words["step_row_after"]]
        caption = words.f("step_row_caption", row=i, word=state.vocab[i], n=run["n"])
        parts.append(
            matrix_html(
                np.stack(rows),
                labels,
                range(len(before_D)),
                words=words,
                caption=caption,
                spec="+.4f",
                table_id=f"step-row-{i}",
            )
        )
    return _side(*parts)


def step_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    now = _stats(state)
    input_id = state.vocab.index(compute.STEP_INPUT)
    run = state.last_run
    if run is not None:
        before = compute.Stats(run["p"], run["loss"], run["gap"])
        title = words["step_before"] if run["n"] == 1 else words.f("steps_before", n=run["n"])
        columns = [(title, before), (words["step_now"], now)]
        changed = ", ".join(f"{i} {state.vocab[i]}" for i in run["rows"]) or "—"
        notes = [_p(words.f("step_rows", rows=changed), "lab-ok")]
        gradient = _applied_html(state, run, words)
    else:
        columns = [(words["step_now"], now)]
        notes = [_p(words["step_none"])]
        grad_VxD = compute.step_gradient(state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id)
        grad_rows = set(np.flatnonzero(np.abs(grad_VxD).max(1) > 0).tolist())
        gradient = matrix_html(
            grad_VxD,
            _labels(state),
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
        _p(words.f("step_count", n=state.steps)),
        gradient,
    ]
    return {
        "step_result": _view(state, *html_parts),
        "step_chart": _chart_html(state, now, words),
    }


def map_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    tokens = compute.token_map(state.table_VxD)
    cosine = matrix_html(
        tokens.cosine_VxV,
        _labels(state),
        state.vocab,
        words=words,
        caption=words["map_cosine"],
        spec="+.2f",
    )
    points = matrix_html(
        tokens.points_Vx2,
        _labels(state),
        [words.f("map_axis", k=1), words.f("map_axis", k=2)],
        words=words,
        caption=words["map_points"],
    )
    where = "; ".join(
        f"{word} ({words.num(x, '+.2f')}; {words.num(y, '+.2f')})"
        for word, (x, y) in zip(state.vocab, tokens.points_Vx2, strict=True)
    )
    return {
        "map_result": _view(state, _side(points, cosine)),
        "map_points": plot_html(
            _points_svg(state, tokens.points_Vx2, words),
            f"{words['map_points']}: {where}",
            lang,
            "map-points",
        ),
        "map_cosine": plot_html(
            _cosine_svg(state, tokens.cosine_VxV, words),
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
        _p(where + same_input, "lab-ok"),
        _p(f"{words.f('context_outputs', diff=output_diff)} ({verdict}).", cls),
    ]


def context_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    heads = []
    for key in ("context_a", "context_b"):
        sentence = fields[key]
        ids_T = compute.parse_sentence(sentence, state.vocab)
        heads.append((" ".join(sentence.split()), ids_T, compute.one_head(state.table_VxD, ids_T)))
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
        caption=words.f("context_vectors", a=_clip(heads[0][0], 60), b=_clip(heads[1][0], 60)),
        spec="+.4f",
        table_id="context-vectors",
    )
    figures = {}
    for side, (text, ids_T, head) in zip("ab", heads, strict=True):
        title = words.f("context_weights", side=side.upper(), sentence=_clip(text, 40))
        alt = words.f(
            "context_weights_alt",
            side=side.upper(),
            t=len(ids_T),
            last=words.num(float(head.weights_TxT[-1].max()), ".2f"),
        )
        figure = _weights_svg([state.vocab[i] for i in ids_T], head.weights_TxT, title, words)
        figures[f"context_weights_{side}"] = plot_html(
            figure, f"{title}. {alt}", lang, f"context-weights-{side}"
        )
    result = _view(state, *_context_findings(heads, state.vocab, words), vectors)
    return {"context_result": result, **figures}


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
    pos = compute.parse_int(fields["positions_pos"], field="position", low=0, high=length - 1)
    pair = compute.parse_int(fields["positions_pair"], field="pair", low=0, high=dim // 2 - 1)
    values = compute.position_pair(pos, pair, dim)
    text = words.f(
        "positions_values",
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
    heatmap = words.f("positions_heatmap_alt", length=length, dim=dim)
    return {
        "positions_result": _view(None, _p(text, "lab-big")),
        "positions_heatmap": plot_html(
            _heatmap_figure(length, dim, pos, pair, words), heatmap, lang, "positions-heatmap"
        ),
        "positions_similarity": plot_html(
            _similarity_figure(length, dim, pos, words),
            words.f("positions_similarity", pos=pos),
            lang,
            "positions-similarity",
        ),
        "positions_clock": plot_html(
            _clock_figure(dim, pos, pair, words),
            words.f("positions_clock", pos=pos),
            lang,
            "positions-clock",
        ),
    }


@functools.lru_cache(maxsize=1)
def _gpt2_counts() -> tuple[int, int]:
    """GPT-2 small's parameters tied and untied, counted by the model from shapes alone."""
    from minigpt_jax.model.config import GPTConfig
    from minigpt_jax.model.gpt import count_params

    sizes = dict(vocab_size=compute.REAL_VOCAB, n_embd=compute.GPT2_DIM, n_head=12, n_layer=12)
    sizes.update(block_size=1024, pos_encoding="learned")
    tied = count_params(GPTConfig(**sizes, tie_embeddings=True))
    return tied, count_params(GPTConfig(**sizes, tie_embeddings=False))


def sizes_view(state: LabState | None, fields: dict, lang: str) -> dict:
    """The article's [6, 9, 6] on ten rows; the lesson's sizes: V = 50,257, d = 128, learned
    positions up to block_size 64, and GPT-2's tied table."""
    words = TEXT[lang]
    long_state = LabState(compute.LONG_TABLE_VxD, compute.LONG_VOCAB)
    article_T = np.asarray(compute.ARTICLE_IDS, np.int32)
    ids_T = compute.parse_ids(fields["sizes_ids"], compute.REAL_VOCAB, limit=compute.MAX_IDS)
    length = compute.parse_int(
        fields["sizes_length"], field="length", low=1, high=2 * compute.REAL_BLOCK + 36
    )
    x_1xTxD = compute.real_lookup(ids_T)
    shown = min(6, compute.REAL_DIM)
    lookup = matrix_html(
        x_1xTxD[0, :, :shown],
        [f"t={t}: {i}" for t, i in enumerate(ids_T)],
        [*range(shown)],
        words=words,
        caption=words.f(
            "sizes_real_result",
            ids=compute.format_ids(ids_T),
            shape=f"(1, {len(ids_T)}, {compute.REAL_DIM})",
            shown=shown,
        ),
        spec="+.4f",
        table_id="sizes-real",
    )
    try:
        compute.real_lookup(np.zeros(length, np.int32))
        beyond = words.f("sizes_fits", t=length, block=compute.REAL_BLOCK)
        beyond_cls = "lab-ok"
    except ValueError as error:
        beyond = words.f("sizes_beyond", t=length, block=compute.REAL_BLOCK, error=str(error))
        beyond_cls = "lab-diff"
    tied, untied = _gpt2_counts()
    table_size = compute.embedding_table_size(compute.REAL_VOCAB, compute.GPT2_DIM)
    html_parts = [
        _side(
            _table_html(long_state, words, caption=words["sizes_long_table"], rows_hl={6, 9}),
            _op("→"),
            _lookup_html(
                long_state,
                article_T,
                words.f("sizes_article", ids=compute.format_ids(article_T)),
                words,
                rows_hl={0, 2},
                table_id="sizes-article",
            ),
        ),
        _p(words.f("sizes_article_note"), "lab-ok"),
        lookup,
        _p(
            words.f(
                "sizes_real_note",
                vocab=f"{compute.REAL_VOCAB:,}".replace(",", words["thousands"]),
                dim=compute.REAL_DIM,
                block=compute.REAL_BLOCK,
            )
        ),
        _p(beyond, beyond_cls),
        _p(
            words.f(
                "sizes_tying",
                vocab=f"{compute.REAL_VOCAB:,}".replace(",", words["thousands"]),
                dim=compute.GPT2_DIM,
                table=f"{table_size:,}".replace(",", words["thousands"]),
                tied=f"{tied:,}".replace(",", words["thousands"]),
                untied=f"{untied:,}".replace(",", words["thousands"]),
            ),
            "lab-big",
        ),
    ]
    return {"sizes_result": _view(None, *html_parts)}


# ----------------------------------------------------------------------------- the actions
# action(state, fields, lang) -> (new state or None if unchanged, note HTML, {widget key: value})
# or an iterator of such triples (a run of steps, shown as it goes). A FRAME key in the widget
# values marks a frame of a run that re-renders only the table and the run's own part.

FRAME = "_frame"


def show_action(state, fields, lang):
    """Recompute this part's view only."""
    return None, "", {}


def rename_action(state: LabState, fields: dict, lang: str):
    """Renaming ids and rows together is applied to the shared table; then π's inverse and the
    renamed ids fill the fields, so pressing Rename again undoes it."""
    words = TEXT[lang]
    ids_T, perm_V, mode = _rename_inputs(state, fields)
    if mode != "both":
        return None, _p(words["rename_not_applied"]), {}
    result = compute.rename(state.table_VxD, ids_T, perm_V)
    new_state = LabState(result.renamed_table_VxD, compute.rename_vocab(state.vocab, perm_V))
    new_state = new_state._replace(steps=state.steps, history=state.history)
    inverse_V = np.argsort(perm_V)
    note = words.f(
        "rename_applied",
        diff=result.max_abs_diff,
        word=compute.STEP_INPUT,
        id=new_state.vocab.index(compute.STEP_INPUT),
    )
    extra = {
        "rename_ids": compute.format_ids(result.renamed_ids_T),
        "rename_perm": compute.format_ids(inverse_V),
    }
    return new_state, _p(note, "lab-ok"), extra


def _set_value(state: LabState, fields: dict, lang: str, value: float):
    words = TEXT[lang]
    ids_T = compute.parse_ids(fields["edit_ids"], len(state.vocab))
    row, dim = _edit_cell(state, fields)
    old = float(state.table_VxD[row, dim])
    positions = ", ".join(map(str, np.flatnonzero(ids_T == row))) or "—"
    if old == value:
        note = words.f("edit_same", row=row, dim=dim, value=value, positions=positions)
        return None, _p(note, "lab-ok"), {}
    edited_VxD = compute.set_coordinate(state.table_VxD, row, dim, value)
    new_state = state._replace(table_VxD=edited_VxD, last_run=None)
    before_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    after_TxD = np.asarray(compute.lookup(edited_VxD, ids_T[None]))[0]
    changed = compute.changed_positions(before_TxD, after_TxD)
    others = [t for t in range(len(ids_T)) if ids_T[t] != row]
    other = float(np.abs(after_TxD[others] - before_TxD[others]).max()) if others else 0.0
    summary = words.f("edit_summary", row=row, dim=dim, word=state.vocab[row], old=old, new=value)
    if changed:
        effect = words.f(
            "edit_changed", positions=", ".join(map(str, changed)), row=row, other=other
        )
    else:
        effect = words.f("edit_nothing", row=row)
    return new_state, _p(f"{summary} {effect}", "lab-ok"), {}


def slide_action(state: LabState, fields: dict, lang: str):
    limit = compute.MAX_VALUE
    value = compute.parse_number(fields["edit_slider"], field="value", low=-limit, high=limit)
    return _set_value(state, fields, lang, value)


def type_value_action(state: LabState, fields: dict, lang: str):
    limit = compute.MAX_VALUE
    value = _number(fields, "edit_value", lang, low=-limit, high=limit)
    return _set_value(state, fields, lang, value)


def _learning_rate(fields: dict, lang: str) -> float:
    limit = compute.MAX_LEARNING_RATE
    return _number(fields, "step_lr", lang, low=-limit, high=limit)


def _run(state: LabState, n: int, learning_rate: float, lang: str, stop=None) -> Iterator:
    """n steps, yielding the state after each of up to RUN_FRAMES chunks; `stop()` true ends the
    run after the chunk in progress."""
    words = TEXT[lang]
    input_id = state.vocab.index(compute.STEP_INPUT)
    before = _stats(state)
    grad_VxD = compute.step_gradient(state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id)
    last_run = dict(
        n=n,
        p=before.p,
        loss=before.loss,
        gap=before.gap,
        rows=[],
        lr=learning_rate,
        grad=grad_VxD.tolist(),
        before=state.table_VxD.tolist(),
    )
    start_VxD, history, done = state.table_VxD, list(state.history), 0
    chunk = max(1, math.ceil(n / RUN_FRAMES))
    while done < n:
        size = min(chunk, n - done)
        run = compute.train_steps(
            state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id, learning_rate, size
        )
        if not history or history[-1][0] != state.steps:
            history.append((state.steps, float(run.p_Q1[0]), float(run.loss_Q1[0])))
        history += [
            (state.steps + k + 1, float(p), float(loss))
            for k, (p, loss) in enumerate(zip(run.p_Q1[1:], run.loss_Q1[1:], strict=True))
        ]
        done += size
        rows = [
            i for i in range(len(start_VxD)) if not np.array_equal(run.table_VxD[i], start_VxD[i])
        ]
        state = LabState(
            run.table_VxD,
            state.vocab,
            state.steps + size,
            tuple(history[-10 * compute.MAX_STEPS :]),
            {**last_run, "n": done, "rows": rows},
        )
        stopped = stop is not None and stop() and done < n
        last = done == n or stopped
        if stopped:
            note = words.f("steps_stopped", done=done, n=n)
        else:
            note = words.f("steps_running" if not last else "steps_done", done=done, n=n)
        if learning_rate == 0:
            note += " " + words["step_lr_zero"]
        yield state, _p(note, "lab-ok"), {} if last else {FRAME: True}
        if stopped:
            return


def step_action(state: LabState, fields: dict, lang: str, stop=None):
    return _run(state, 1, _learning_rate(fields, lang), lang, stop)


def steps_action(state: LabState, fields: dict, lang: str, stop=None):
    n = compute.parse_int(fields["step_n"], field="steps", low=1, high=compute.MAX_STEPS)
    return _run(state, n, _learning_rate(fields, lang), lang, stop)


def reset_action(state: LabState, fields: dict, lang: str):
    return initial_state(), _p(TEXT[lang]["reset_done"], "lab-ok"), {}


def equal_action(state: LabState, fields: dict, lang: str):
    return None, "", {"context_b": fields["context_a"]}


def restore_action(state: LabState, fields: dict, lang: str):
    """On page load: the table kept in this browser's storage, or the article's."""
    words = TEXT[lang]
    stored = from_storage(fields["storage"])
    if stored is None:
        return initial_state(), _p(words["storage_fresh"]), {}
    if table_key(stored) == table_key(initial_state()) and stored.steps == 0:
        return stored, _p(words["storage_fresh"]), {}
    return stored, _p(words.f("storage_restored", n=stored.steps), "lab-ok"), {}


# ----------------------------------------------------------------------------- the page's parts


def _dashed(key: str) -> str:
    """A component's elem_id: its key with dashes ("lookup_ids" -> "lookup-ids")."""
    return key.replace("_", "-")


class Field(NamedTuple):
    """A textbox labelled TEXT[lang][key]; a `decimal` field's default is written in the page's
    numbers (0,4 in Spanish)."""

    key: str
    default: str
    decimal: bool = False

    def start(self, lang: str) -> str:
        return self.default.replace(".", ",") if self.decimal and lang == "es" else self.default

    def make(self, words: Words):
        return gr.Textbox(
            self.start(words.lang), label=words[self.key], elem_id=_dashed(self.key), max_lines=1
        )


class Choice(NamedTuple):
    """Radio buttons labelled TEXT[lang][key]; each option is (its text key or text, its value).
    The page's script gives a group's buttons one name: one Tab stop, arrow keys move it."""

    key: str
    options: tuple[tuple[str | None, str], ...]
    default: str

    def start(self, lang: str) -> str:
        return self.default

    def make(self, words: Words):
        options = [(words.get(text, text), value) for text, value in self.options]
        return gr.Radio(
            options, value=self.default, label=words[self.key], elem_id=_dashed(self.key)
        )


class Slider(NamedTuple):
    """A slider labelled TEXT[lang][key] (its view sets its value, range and label). Its number
    box and ↺ button are off: a typed value goes through the field beside it, which reads the
    page's numbers and names the limit; the ↺ button reset to the page's start, not the table."""

    key: str
    default: float

    def start(self, lang: str) -> float:
        return self.default

    def make(self, words: Words):
        return gr.Slider(
            -SLIDER_RANGE,
            SLIDER_RANGE,
            value=self.default,
            step=0.01,
            label=words[self.key],
            elem_id=_dashed(self.key),
            buttons=[],
        )


class Button(NamedTuple):
    """A button reading TEXT[lang][key]."""

    key: str
    primary: bool = True
    default: None = None  # a button has no value of its own

    def make(self, words: Words):
        variant = "primary" if self.primary else "secondary"
        return gr.Button(
            words[self.key],
            variant=variant,
            elem_id=_dashed(self.key),
            elem_classes=["lab-button", variant],
        )


class Event(NamedTuple):
    """`trigger`'s `kind` event runs `action`, then the views (see the module's docstring).

    `keep` names outputs this event leaves alone (the slider being dragged). `stops`: the event
    first asks this tab's run to stop (Stop, Reset); with no action it does nothing else.
    `run`: the action takes `stop`, a function that says whether Stop was pressed."""

    trigger: str
    action: Callable | None = show_action
    kind: str = "click"
    trigger_mode: str | None = None
    keep: tuple[str, ...] = ()
    stops: bool = False
    run: bool = False


class Part(NamedTuple):
    """One part of the page: its words are TEXT[lang]["<name>_heading"] and "<name>_explain"."""

    name: str  # elem_ids part-<name>, <name>-message, <name>-result
    layout: tuple  # widgets in order: a tuple of widgets is one gr.Row, a bare widget stands alone
    view: Callable  # view(state, fields, lang) -> {output key: value}
    events: tuple[Event, ...]
    plots: tuple[str, ...] = ()  # figure keys (HTML images), in a row under the result
    reads_table: bool = True  # recomputed whenever the shared table changes
    heading_args: Callable[[], dict] | None = None  # fills the heading's {placeholders}
    above: Callable[[Words], str] | None = None  # HTML of the words, above the widgets


def _output_weights_html(words: Words) -> str:
    return matrix_html(
        compute.OUTPUT_WEIGHTS_2xD,
        [f"w_{compute.STEP_TARGET}", f"w_{compute.STEP_RIVAL}"],
        range(compute.OUTPUT_WEIGHTS_2xD.shape[1]),
        words=words,
        caption=words["step_outputs"],
    )


_LIVE = "always_last"  # a slider or a field sends its latest value once the last event is done

# The page's parts in order. A new part is one row here, its words under its name in text.py.
PARTS = (
    Part(
        "lookup",
        ((Field("lookup_ids", "[0, 1, 0]"), Button("lookup_button")),),
        lookup_view,
        (Event("lookup_button"), Event("lookup_ids", kind="submit")),
    ),
    Part(
        "rename",
        (
            (
                Field("rename_ids", "[0, 1, 2]"),
                Field("rename_perm", "[5, 3, 0, 1, 2, 4]"),
            ),
            Choice(
                "rename_mode",
                (("mode_both", "both"), ("mode_ids", "ids"), ("mode_rows", "rows")),
                "both",
            ),
            Button("rename_button"),
        ),
        rename_view,
        (
            Event("rename_button", rename_action),
            Event("rename_mode", kind="input"),
            Event("rename_ids", kind="submit"),
            Event("rename_perm", kind="submit"),
        ),
    ),
    Part(
        "edit",
        (
            Field("edit_ids", "[0, 1, 2, 1]"),
            Choice(
                "edit_row", tuple((f"{i} {w}", str(i)) for i, w in enumerate(compute.VOCAB)), "1"
            ),
            Choice("edit_dim", tuple((str(d), str(d)) for d in range(6)), "3"),
            Slider("edit_slider", float(compute.TABLE_VxD[1, 3])),
            (Field("edit_value", "0.9", decimal=True), Button("edit_button")),
        ),
        edit_view,
        (
            Event("edit_slider", slide_action, "input", _LIVE, keep=("edit_slider",)),
            Event("edit_button", type_value_action),
            Event("edit_value", type_value_action, "submit"),
            Event("edit_row", kind="input"),
            Event("edit_dim", kind="input"),
            Event("edit_ids", kind="submit"),
        ),
    ),
    Part(
        "step",
        (
            (
                Field("step_lr", str(compute.LEARNING_RATE), decimal=True),
                Button("step_button"),
            ),
            (
                Field("step_n", "50"),
                Button("steps_button"),
                Button("stop_button", primary=False),
                Button("reset_button", primary=False),
            ),
        ),
        step_view,
        (
            Event("step_button", step_action, trigger_mode="multiple", run=True),
            Event("step_lr", step_action, "submit", run=True),
            Event("steps_button", steps_action, trigger_mode="multiple", run=True),
            Event("step_n", steps_action, "submit", run=True),
            Event("stop_button", None, trigger_mode="multiple", stops=True),
            Event("reset_button", reset_action, trigger_mode="multiple", stops=True),
        ),
        plots=("step_chart",),
        heading_args=_step_words,
        above=_output_weights_html,
    ),
    Part("map", (), map_view, (), plots=("map_points", "map_cosine")),
    Part(
        "context",
        (
            (Field("context_a", compute.SENTENCES[0]), Field("context_b", compute.SENTENCES[1])),
            (Button("context_button"), Button("equal_button", primary=False)),
        ),
        context_view,
        (
            Event("context_button"),
            Event("equal_button", equal_action),
            Event("context_a", kind="submit"),
            Event("context_b", kind="submit"),
        ),
        plots=("context_weights_a", "context_weights_b"),
    ),
    Part(
        "positions",
        (
            (
                Field("positions_dim", "16"),
                Field("positions_pos", "5"),
                Field("positions_pair", "1"),
                Field("positions_length", "64"),
            ),
            Button("positions_button"),
        ),
        positions_view,
        (
            Event("positions_button"),
            *(Event(f"positions_{key}", kind="submit") for key in ("dim", "pos", "pair", "length")),
        ),
        plots=("positions_heatmap", "positions_similarity", "positions_clock"),
        reads_table=False,
    ),
    Part(
        "sizes",
        (
            (
                Field("sizes_ids", compute.format_ids(compute.REAL_IDS)),
                Field("sizes_length", "100"),
            ),
            Button("sizes_button"),
        ),
        sizes_view,
        (
            Event("sizes_button"),
            Event("sizes_ids", kind="submit"),
            Event("sizes_length", kind="submit"),
        ),
        reads_table=False,
    ),
)


def _widgets(layout: tuple):
    """The layout's widgets in order."""
    for item in layout:
        yield from item if type(item) is tuple else (item,)


def _defaults(lang: str = "en") -> dict:
    """Every widget's starting value by key, in the page's numbers."""
    return {
        w.key: w.start(lang)
        for part in PARTS
        for w in _widgets(part.layout)
        if w.default is not None
    }


def _render(part: Part, state: LabState, fields: dict, lang: str, *, own: bool) -> dict:
    """The part's view. Bad input in another part's fields is that part's message, not an error
    of this event; the part's own bad input raises (nothing changes, its message says why)."""
    try:
        return part.view(state, fields, lang)
    except LabInputError as error:
        if own:
            raise
        cleared = {key: "" for key in part.plots}
        return {f"{part.name}_result": _view(state, _error_html(error, lang)), **cleared}


class Tab:
    """One browser tab's table on the server, its events' turns, the flag that stops its run,
    and what its outputs show now (sent again only when they change).

    Each event takes a ticket as it arrives (in the server's event loop, so in the order the
    tab sent them) and runs when its turn comes: a tab's events apply one after the other, in
    order, while other tabs' events run beside them."""

    def __init__(self):
        self.state = initial_state()
        self.stop = threading.Event()
        self.shown: dict[str, str] = {}
        self.used: dict[str, dict] = {}  # see Page.outputs
        self._tickets = itertools.count()
        self._serving = 0
        self._finished: set[int] = set()
        self._waiting: dict[int, asyncio.Future] = {}

    def ticket(self) -> int:
        return next(self._tickets)

    async def turn(self, ticket: int) -> None:
        if self._serving != ticket:
            future = asyncio.get_running_loop().create_future()
            self._waiting[ticket] = future
            await future

    def release(self, ticket: int) -> None:
        """The event is done (or abandoned): the next ticket's turn."""
        self._finished.add(ticket)
        while self._serving in self._finished:
            self._finished.discard(self._serving)
            self._serving += 1
        future = self._waiting.pop(self._serving, None)
        if future is not None and not future.done():
            future.set_result(None)


class Tabs:
    """The open tabs by Gradio's session hash; a closed tab is dropped (`demo.unload`), and
    beyond `limit` the longest unused one goes, so memory stays flat."""

    def __init__(self, limit: int = 64):
        self.limit = limit
        self._tabs: collections.OrderedDict[str, Tab] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, session: str) -> Tab:
        with self._lock:
            tab = self._tabs.pop(session, None) or Tab()
            self._tabs[session] = tab
            while len(self._tabs) > self.limit:
                self._tabs.popitem(last=False)
            return tab

    def drop(self, session: str) -> None:
        with self._lock:
            self._tabs.pop(session, None)

    def __len__(self) -> int:
        return len(self._tabs)


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "local"


class Page(NamedTuple):
    """The built page's components by key, the language and the open tabs."""

    components: dict
    lang: str
    tabs: Tabs

    def fields(self, values: dict) -> dict:
        """The event's input values by key (Gradio passes a set of inputs as a dict)."""
        return {key: values[c] for key, c in self.components.items() if c in values}

    def handler(self, part: Part, event: Event) -> Callable:
        """The Gradio function of one event: action, then views, then outputs by component.
        The tab's turn lasts the whole event (a run too), so the tab's events apply one after
        the other; other tabs do not wait (the work runs in threads)."""

        async def handle(values: dict, request: gr.Request = None):
            tab = self.tabs.get(_session(request))
            if event.stops:
                tab.stop.set()
            if event.action is None:  # Stop: it writes nothing (the run says where it stopped)
                yield None
                return
            fields = self.fields(values)
            ticket = tab.ticket()
            try:
                await tab.turn(ticket)
                tab.stop.clear()
                state = tab.state
                if event.run:
                    action = functools.partial(
                        event.action, state, fields, self.lang, tab.stop.is_set
                    )
                else:
                    action = functools.partial(event.action, state, fields, self.lang)
                results = await asyncio.to_thread(action)
                results = results if isinstance(results, Iterator) else iter([results])
                while (result := await asyncio.to_thread(next, results, None)) is not None:
                    new_state, note, extra = result
                    out = await asyncio.to_thread(
                        self.outputs, part, event, state, new_state, note, fields, extra, tab.used
                    )
                    if new_state is not None:
                        tab.state = state = new_state
                    yield self.changed(tab, out, self.components[f"{part.name}_message"])
            except LabInputError as error:
                yield {self.components[f"{part.name}_message"]: _error_html(error, self.lang)}
            except Exception as error:  # noqa: BLE001 - no error reaches the page unexplained
                log.exception("lab: %s's %s failed", part.name, event.trigger)
                message = self.components[f"{part.name}_message"]
                yield {message: _unexpected_html(error, self.lang)}
            finally:
                tab.release(ticket)

        return handle

    def changed(self, tab: Tab, out: dict, message) -> dict:
        """The outputs whose HTML differs from what the tab shows (the rest are not sent); the
        part's message always goes (Gradio takes an empty dict for a missing value)."""
        sent = {}
        for component, value in out.items():
            key = component._id
            if isinstance(value, str) and component is not message:
                if tab.shown.get(key) == value:
                    continue
                tab.shown[key] = value
            sent[component] = value
        return sent

    def outputs(self, part, event, state, new_state, note, fields, extra, used=None) -> dict:
        """The outputs of one step of an event by component: the new state and every view that
        reads it (or this part's view alone; a run's frame: the table and this part), the
        widgets the action set, the part's message.

        `used` holds, per part, the fields it last showed without an error: another part is
        recomputed from those, so a half-typed field there is not read until it is submitted."""
        used = {} if used is None else used
        extra = dict(extra)
        frame = extra.pop(FRAME, False)
        fields, out = {**fields, **extra}, {}
        if new_state is not None:
            compute.check_finite(new_state.table_VxD)
            out.update(storage=to_storage(new_state))
            out["table"] = _shared_table_html(new_state, TEXT[self.lang])
            for other in PARTS:
                if other.reads_table and other is not part and not frame:
                    shown = {**fields, **used.get(other.name, {})}
                    out.update(_render(other, new_state, shown, self.lang, own=False))
        out.update(_render(part, new_state or state, fields, self.lang, own=True))
        used[part.name] = {w.key: fields[w.key] for w in _widgets(part.layout) if w.key in fields}
        out.update(extra)
        out = {key: value for key, value in out.items() if key not in event.keep}
        out[f"{part.name}_message"] = note
        return {self.components[key]: value for key, value in out.items() if key in self.components}

    def output_components(self, part: Part, event: Event | None = None) -> list:
        """Everything an event of `part` may write: for one that may change the table, the
        table, every view and widget and its message; for one that only shows (it never
        changes the table), its own part's outputs and widgets alone, so that the other parts
        stay usable while it runs."""
        if event is not None and event.action is None:
            return []
        if event is not None and event.action in (show_action, equal_action):
            own = {f"{part.name}_result", f"{part.name}_message", *part.plots}
            own.update(w.key for w in _widgets(part.layout) if w.default is not None)
            return [c for key, c in self.components.items() if key in own]
        skip = {f"{other.name}_message" for other in PARTS if other is not part}
        return [c for key, c in self.components.items() if key not in skip]


def _heading(part: Part, words: Words) -> str:
    heading = words[f"{part.name}_heading"]
    if part.heading_args:
        heading = words.f(f"{part.name}_heading", **part.heading_args())
    return f"## {heading}"


def _build_widgets(layout: tuple, words: Words) -> dict:
    """The layout's widgets by key, each tuple of them in a gr.Row."""
    widgets = {}
    for item in layout:
        if type(item) is tuple:
            with gr.Row(equal_height=True):
                widgets.update((widget.key, widget.make(words)) for widget in item)
        else:
            widgets[item.key] = item.make(words)
    return widgets


def _build_part(part: Part, components: dict, start: LabState, lang: str) -> None:
    """The part's group: heading, explanation, widgets, message, result and plots."""
    words = TEXT[lang]
    fields = {**_defaults(lang), "state": start}
    shown = part.view(start, fields, lang)
    with gr.Group(elem_id=f"part-{part.name}"):
        gr.Markdown(_heading(part, words))
        gr.Markdown(words[f"{part.name}_explain"], elem_classes=["lab-explain"])
        if part.above:
            gr.HTML(part.above(words))
        components.update(_build_widgets(part.layout, words))
        components[f"{part.name}_message"] = gr.HTML("", elem_id=f"{part.name}-message")
        result_key = f"{part.name}_result"
        components[result_key] = gr.HTML(shown[result_key], elem_id=_dashed(result_key))
        if part.plots:
            with gr.Row(elem_classes=["lab-plots"]):
                for key in part.plots:
                    components[key] = gr.HTML(
                        shown[key], elem_id=_dashed(key), min_width=300, js_on_load=None
                    )


# The page's script (in <head>, before Gradio's own): Gradio's words in the page's language
# (it reads navigator.language), <html lang>, the aria-labels Gradio writes in English, one name
# per radio group, live messages, and a mark on each table wrapper that scrolls sideways.
_PAGE_JS = """<script>
(() => {
  const LANG = "__LANG__";
  const ARIA = __ARIA__;
  for (const key of ["language", "languages"]) {
    try {
      Object.defineProperty(Navigator.prototype, key, {
        configurable: true, get: () => (key === "language" ? LANG : [LANG]),
      });
    } catch (error) {}
  }
  const fix = () => {
    const root = document.documentElement;
    if (root.lang !== LANG) root.lang = LANG;
    document.querySelectorAll("fieldset").forEach((group, k) => {
      const name = "lab-group-" + (group.id || k);
      group.querySelectorAll("input[type=radio]").forEach((radio) => {
        if (radio.name !== name) radio.name = name;
      });
    });
    document.querySelectorAll("[aria-label]").forEach((element) => {
      const label = element.getAttribute("aria-label");
      for (const [english, local] of ARIA) {
        if (label.startsWith(english)) {
          element.setAttribute("aria-label", local + label.slice(english.length));
          break;
        }
      }
    });
    document.querySelectorAll("[id$='-message']").forEach((element) => {
      if (!element.hasAttribute("aria-live")) element.setAttribute("aria-live", "polite");
    });
    document.querySelectorAll(".lab-scroll").forEach((wrap) => {
      wrap.classList.toggle("lab-overflows", wrap.scrollWidth > wrap.clientWidth + 1);
    });
  };
  let queued = false;
  const later = () => {
    if (queued) return;
    queued = true;
    setTimeout(() => { queued = false; fix(); }, 30);
  };
  new MutationObserver(later).observe(document.documentElement, {
    subtree: true, childList: true, characterData: true, attributes: true,
    attributeFilter: ["lang", "name", "aria-label"],
  });
  window.addEventListener("resize", later);
})();
</script>"""


def page_js(lang: str) -> str:
    aria = TEXT[lang]["aria"] if lang != "en" else []
    return _PAGE_JS.replace("__LANG__", lang).replace("__ARIA__", json.dumps(aria))


def build(lang: str = "en") -> gr.Blocks:
    """The lab's Blocks in `lang` (one of LANGUAGES): the shared table, then every part in PARTS."""
    if lang not in LANGUAGES:
        raise ValueError(f"--lang must be one of {', '.join(LANGUAGES)}, got {lang!r}.")
    words = TEXT[lang]
    start = initial_state()
    with gr.Blocks(title=words["title"], analytics_enabled=False) as demo:
        components = {
            "storage": gr.BrowserState(to_storage(start), storage_key=STORAGE_KEY),
        }
        gr.Markdown(f"# {words['title']}\n\n{words['intro']}")
        with gr.Group(elem_id="part-table"):
            gr.Markdown(f"**{words['table_heading']}**")
            components["table"] = gr.HTML(_shared_table_html(start, words), elem_id="table")
            components["table_message"] = gr.HTML("", elem_id="table-message")
        for part in PARTS:
            _build_part(part, components, start, lang)
        page = Page(components, lang, Tabs())
        demo.lab_tabs = page.tabs  # the tests and the memory script count the open tabs
        widgets = {w.key for part in PARTS for w in _widgets(part.layout) if w.default is not None}
        inputs = {components[key] for key in ("storage", *widgets)}
        restore = Part("table", (), lambda s, f, lang: {}, (), reads_table=False)
        demo.load(
            page.handler(restore, Event("load", restore_action)),
            inputs,
            page.output_components(restore),
            concurrency_limit=None,
            show_progress="hidden",
        )

        def closed(request: gr.Request):
            page.tabs.drop(_session(request))

        demo.unload(closed)
        for part in PARTS:
            for event in part.events:
                getattr(components[event.trigger], event.kind)(
                    page.handler(part, event),
                    inputs,
                    page.output_components(part, event),
                    trigger_mode=event.trigger_mode,
                    concurrency_limit=None,  # each tab's lock orders its own events
                    show_progress="hidden"
                    if event.kind != "click" or event.action is None
                    else "minimal",
                    show_progress_on=[components[f"{part.name}_result"]],
                )
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
    demo.queue(default_concurrency_limit=None)
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        quiet=True,
        prevent_thread_lock=True,
        theme=_THEME,
        css=_CSS,
        head=page_js(lang),
        footer_links=[],
    )
    print(f"minigpt-jax lab: {url} (Ctrl-C stops it)", flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        demo.block_thread()
    finally:
        demo.close()
