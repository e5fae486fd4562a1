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

import hashlib
import html
import logging
import math
import os
import socket
import textwrap
import webbrowser
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from minigpt_jax.lab import compute
from minigpt_jax.lab.compute import LabInputError
from minigpt_jax.lab.text import LANGUAGES, TEXT

# The lab talks to no one but its own browser tab: no usage statistics.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import matplotlib  # noqa: E402
import pandas as pd  # noqa: E402

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
.lab-scroll { overflow-x: auto; max-width: 100%; -webkit-overflow-scrolling: touch; }
.lab-table { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 13px;
  white-space: nowrap; }
.lab-table td, .lab-table th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
.lab-table th { background: #f3f3f3; }
.lab-table tr.hl td, .lab-table td.hl { background: #ffe08a; }
.lab-table td.one { background: #cfe3ff; font-weight: 700; }
.lab-table caption { caption-side: top; text-align: left; font-weight: 600; padding: 4px 0;
  white-space: normal; }
.lab-side { display: flex; gap: 16px; flex-wrap: wrap; align-items: center; }
.lab-side > * { min-width: 0; max-width: 100%; }
.lab-op { font-size: 22px; font-weight: 700; }
.lab-ok { color: #0a6b2d; font-weight: 600; }
.lab-diff { color: #a13d00; font-weight: 600; }
.lab-error { color: #b00020; font-weight: 600; border-left: 4px solid #b00020; padding-left: 8px; }
.lab-big { font-size: 18px; font-weight: 700; }
.lab-explain { font-size: 14px; color: #333; }
button.lab-button { border: 2px solid #4b5563 !important; border-radius: 8px !important;
  box-shadow: 0 1px 2px rgba(0,0,0,.25) !important; font-weight: 600 !important; }
button.lab-button.secondary { background: #ffffff !important; color: #1f2937 !important; }
button.lab-button:hover { filter: brightness(0.95); }
.lab-plot img { max-width: 100%; height: auto; }
@media (max-width: 600px) {
  .lab-table { font-size: 12px; }
  .lab-big { font-size: 16px; }
}
"""


def _lang_js(lang: str) -> str:
    """Sets <html lang> to the page's language (Gradio writes its own; this runs after it)."""
    script = (
        "() => { const set = () => { if (document.documentElement.lang !== 'LANG') "
        "document.documentElement.lang = 'LANG'; }; set(); "
        "new MutationObserver(set).observe(document.documentElement, "
        "{attributes: true, attributeFilter: ['lang']}); }"
    )
    return script.replace("LANG", lang)


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


def _scroll(inner: str) -> str:
    """A wrapper that scrolls sideways when its table is wider than the screen (phones)."""
    return f'<div class="lab-scroll">{inner}</div>'


def matrix_html(
    matrix,
    row_labels,
    col_labels,
    *,
    caption: str = "",
    rows_hl=(),
    cells_hl=(),
    fmt: str = "{:+.3f}",
    cls: str = "",
) -> str:
    """An HTML table with highlighted rows and cells, in a sideways-scrolling wrapper."""
    head = "".join(f"<th>{_e(c)}</th>" for c in ["", *col_labels])
    body = []
    for i, (label, row) in enumerate(zip(row_labels, np.asarray(matrix), strict=True)):
        cells = "".join(
            f"<td{' class=hl' if (i, j) in cells_hl else ''}>{fmt.format(float(v) + 0.0)}</td>"
            for j, v in enumerate(row)
        )
        row_cls = ' class="hl"' if i in rows_hl else ""
        body.append(f"<tr{row_cls}><th>{_e(label)}</th>{cells}</tr>")
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    table = f'<table class="lab-table {cls}">{cap}<tr>{head}</tr>{"".join(body)}</table>'
    return _scroll(table)


def _one_hot_html(one_hot_TxV, ids_T, vocab, caption: str) -> str:
    head = f"<th></th>{''.join(f'<th>{v}</th>' for v in range(len(vocab)))}"
    body = "".join(
        f"<tr><th>t={t}</th>"
        + "".join(
            f'<td class="one">{value:g}</td>' if value else f"<td>{value:g}</td>" for value in row
        )
        + "</tr>"
        for t, row in enumerate(np.asarray(one_hot_TxV))
    )
    cap = f"<caption>{_e(caption)}</caption>"
    return _scroll(f'<table class="lab-table" id="one-hot">{cap}<tr>{head}</tr>{body}</table>')


def _labels(state: LabState) -> list[str]:
    return [f"{i} {word}" for i, word in enumerate(state.vocab)]


def _table_html(state: LabState, **kwargs) -> str:
    return matrix_html(state.table_VxD, _labels(state), range(state.table_VxD.shape[1]), **kwargs)


def _shared_table_html(state: LabState) -> str:
    """The table on top of the page, with its fingerprint and exact values for the tests."""
    exact = html.escape(str(to_storage(state)["table"]), quote=True)
    return (
        f'<div class="lab-view" data-w="{table_key(state)}" data-table="{exact}">'
        f"{_table_html(state)}</div>"
    )


def _lookup_html(state: LabState, ids_T, caption: str, rows_hl=()) -> str:
    x_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    labels = [f"t={t}: {i} {state.vocab[i]}" for t, i in enumerate(ids_T)]
    return matrix_html(x_TxD, labels, range(x_TxD.shape[1]), caption=caption, rows_hl=rows_hl)


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
    text = TEXT[lang]["unexpected_error"].format(error=f"{type(error).__name__}: {error}"[:300])
    return _p(text, "lab-error")


def _side(*tables: str) -> str:
    return f'<div class="lab-side">{"".join(tables)}</div>'


def _op(symbol: str) -> str:
    return f'<span class="lab-op">{_e(symbol)}</span>'


# ----------------------------------------------------------------------------- plots


def _wrapped(title: str, width: int = 42) -> str:
    return "\n".join(textwrap.wrap(title, width))


def _figure(width: float = 4.2, height: float = 3.4) -> Figure:
    """A figure about as wide as a phone's screen, so the page does not shrink its text."""
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    figure.patch.set_facecolor("white")
    return figure


def _weights_figure(tokens, weights_TxT, title: str) -> Figure:
    """Attention weights as a heatmap (row: query, column: key), each cell labelled."""
    figure = _figure()
    ax = figure.subplots()
    image = ax.imshow(weights_TxT, cmap="Blues", vmin=0, vmax=1)
    length = len(tokens)
    if length <= 8:
        for q in range(length):
            for k in range(length):
                value = weights_TxT[q, k]
                ax.text(k, q, f"{value:.2f}", ha="center", va="center", fontsize=9,
                        color="white" if value > 0.6 else "black")  # fmt: skip
    ticks = range(length)
    ax.set_xticks(ticks, tokens, rotation=45 if length > 3 else 0, ha="right", fontsize=9)
    ax.set_yticks(ticks, tokens, fontsize=9)
    figure.colorbar(image, ax=ax, shrink=0.8)
    ax.set_title(_wrapped(title), fontsize=10)
    return figure


def _points_figure(state: LabState, points_Vx2, words: dict) -> Figure:
    figure = _figure()
    ax = figure.subplots()
    ax.axhline(0, color="#bbb", lw=0.8)
    ax.axvline(0, color="#bbb", lw=0.8)
    for i, (word, (x, y)) in enumerate(zip(state.vocab, points_Vx2, strict=True)):
        ax.scatter([x], [y], s=40, color=f"C{compute.VOCAB.index(word)}")
        offset = (5, 4) if i % 2 == 0 else (5, -11)  # neighbours' labels above and below
        ax.annotate(f"{i} {word}", (x, y), textcoords="offset points", xytext=offset, fontsize=9)
    low, high = float(points_Vx2.min()), float(points_Vx2.max())
    pad = max(0.25, 0.15 * (high - low))
    ax.set_xlim(min(low, -1.0) - pad, max(high, 1.0) + pad)
    ax.set_ylim(min(low, -1.0) - pad, max(high, 1.0) + pad)
    ax.set_aspect("equal")
    ax.set_xlabel(words["map_axis"].format(k=1), fontsize=9)
    ax.set_ylabel(words["map_axis"].format(k=2), fontsize=9)
    ax.set_title(_wrapped(words["map_points"]), fontsize=10)
    return figure


def _cosine_figure(state: LabState, cosine_VxV, words: dict) -> Figure:
    figure = _figure()
    ax = figure.subplots()
    image = ax.imshow(cosine_VxV, cmap="RdBu_r", vmin=-1, vmax=1)
    for i in range(len(state.vocab)):
        for j in range(len(state.vocab)):
            value = cosine_VxV[i, j]
            color = "white" if abs(value) > 0.6 else "black"
            ax.text(j, i, f"{value:+.2f}", ha="center", va="center", fontsize=8, color=color)
    ticks = range(len(state.vocab))
    ax.set_xticks(ticks, state.vocab, rotation=45, ha="right", fontsize=9)
    ax.set_yticks(ticks, state.vocab, fontsize=9)
    figure.colorbar(image, ax=ax, shrink=0.8)
    ax.set_title(_wrapped(words["map_cosine"]), fontsize=10)
    return figure


def _heatmap_figure(length: int, dim: int, pos: int, pair: int, words: dict) -> Figure:
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


def _similarity_figure(length: int, dim: int, pos: int, words: dict) -> Figure:
    """P[pos] · P[pos + k] against the offset k."""
    similarity_TxT = compute.position_similarity(length, dim)
    figure = _figure()
    ax = figure.subplots()
    offsets = np.arange(length) - pos
    ax.plot(offsets, similarity_TxT[pos], marker=".")
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(words["positions_offset"], fontsize=9)
    ax.set_ylabel(words["positions_dot"], fontsize=9)
    ax.set_title(_wrapped(words["positions_similarity"].format(pos=pos)), fontsize=10)
    return figure


def _clock_figure(dim: int, pos: int, pair: int, words: dict) -> Figure:
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
    ax.set_title(_wrapped(words["positions_clock"].format(pos=pos), 38), fontsize=10)
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
            _one_hot_html(one_hot_TxV, ids_T, state.vocab, words["lookup_one_hot_matrix"]),
            _op("·"),
            _table_html(state, caption=words["lookup_rows"], rows_hl=set(ids_T.tolist())),
            _op("="),
            _lookup_html(
                state, ids_T, words["lookup_result"].format(t=len(ids_T), d=x_TxD.shape[1])
            ),
        ),
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
                state, ids_T, words["rename_before"].format(ids=compute.format_ids(ids_T))
            ),
            _lookup_html(
                after_state,
                result.renamed_ids_T,
                words["rename_after"].format(ids=compute.format_ids(result.renamed_ids_T)),
            ),
            _table_html(
                after_state,
                caption=words["rename_table_after"],
                rows_hl=set(result.renamed_ids_T.tolist()),
            ),
        ),
        _p(
            words["rename_same" if same else "rename_changed"].format(diff=result.max_abs_diff),
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
            _table_html(state, caption="W_E", cells_hl={(row, dim)}),
            _lookup_html(
                state, ids_T, words["edit_lookup"].format(ids=ids, row=row), rows_hl=occurrences
            ),
        ),
        _p(
            words["edit_occurs" if occurrences else "edit_absent"].format(
                row=row, word=state.vocab[row], positions=found
            )
        ),
    ]
    low, high = min(-SLIDER_RANGE, math.floor(value)), max(SLIDER_RANGE, math.ceil(value))
    label = words["edit_slider"].format(row=row, dim=dim, word=state.vocab[row])
    return {
        "edit_result": _view(state, *html_parts),
        "edit_slider": gr.update(value=value, minimum=low, maximum=high, label=label),
        "edit_row": gr.update(choices=[(name, str(i)) for i, name in enumerate(_labels(state))]),
    }


def _step_words() -> dict:
    return dict(input=compute.STEP_INPUT, target=compute.STEP_TARGET, rival=compute.STEP_RIVAL)


def _stats(state: LabState) -> compute.Stats:
    input_id = state.vocab.index(compute.STEP_INPUT)
    return compute.step_stats(state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id)


def _figures_html(columns: list[tuple[str, compute.Stats]], words: dict) -> str:
    """p(target), the loss and the logit gap, one column per table."""
    names = _step_words()
    rows = [
        (words["step_p"].format(**names), lambda s: f"{100 * s.p:.1f}%"),
        (words["step_loss"], lambda s: f"{s.loss:.3f}"),
        (words["step_gap"].format(**names), lambda s: f"{s.gap:+.4f}"),
    ]
    head = "<tr><th></th>" + "".join(f"<th>{_e(name)}</th>" for name, _ in columns) + "</tr>"
    body = "".join(
        f"<tr><th>{_e(label)}</th>"
        + "".join(f"<td>{show(stats)}</td>" for _, stats in columns)
        + "</tr>"
        for label, show in rows
    )
    return _scroll(f'<table class="lab-table lab-big" id="step-figures">{head}{body}</table>')


def _chart(state: LabState, now: compute.Stats, words: dict) -> pd.DataFrame:
    """p(target) and the loss after each step taken, and at the table as it is now."""
    points = list(state.history)
    if not points or points[-1] != (state.steps, now.p, now.loss):
        points.append((state.steps, now.p, now.loss))  # an edit since the last step shows a jump
    p_name = words["step_p"].format(**_step_words())
    rows = [(s, p, p_name) for s, p, _ in points] + [
        (s, loss, words["step_loss"]) for s, _, loss in points
    ]
    return pd.DataFrame(rows, columns=["step", "value", "series"])


def step_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    now = _stats(state)
    input_id = state.vocab.index(compute.STEP_INPUT)
    grad_VxD = compute.step_gradient(state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id)
    run = state.last_run
    if run is not None:
        before = compute.Stats(run["p"], run["loss"], run["gap"])
        title = words["step_before"] if run["n"] == 1 else words["steps_before"].format(n=run["n"])
        columns = [(title, before), (words["step_now"], now)]
        changed = ", ".join(f"{i} {state.vocab[i]}" for i in run["rows"]) or "—"
        notes = [_p(words["step_rows"].format(rows=changed), "lab-ok")]
    else:
        columns = [(words["step_now"], now)]
        notes = [_p(words["step_none"])]
    grad_rows = set(np.flatnonzero(np.abs(grad_VxD).max(1) > 0).tolist())
    html_parts = [
        _figures_html(columns, words),
        *notes,
        _p(words["step_count"].format(n=state.steps)),
        _side(
            matrix_html(
                grad_VxD,
                _labels(state),
                range(grad_VxD.shape[1]),
                caption=words["step_grad"],
                rows_hl=grad_rows,
                fmt="{:+.4f}",
            ),
        ),
    ]
    return {"step_result": _view(state, *html_parts), "step_chart": _chart(state, now, words)}


def map_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    tokens = compute.token_map(state.table_VxD)
    cosine = matrix_html(
        tokens.cosine_VxV,
        _labels(state),
        state.vocab,
        caption=words["map_cosine"],
        fmt="{:+.2f}",
    )
    points = matrix_html(
        tokens.points_Vx2,
        _labels(state),
        [words["map_axis"].format(k=1), words["map_axis"].format(k=2)],
        caption=words["map_points"],
    )
    return {
        "map_result": _view(state, _side(points, cosine)),
        "map_points": _points_figure(state, tokens.points_Vx2, words),
        "map_cosine": _cosine_figure(state, tokens.cosine_VxV, words),
    }


def _context_findings(texts, heads, vocab, words: dict) -> list[str]:
    """Whether the last words' inputs and outputs differ, and what that says."""
    (_, ids_a, head_a), (_, ids_b, head_b) = heads
    input_diff = float(np.abs(head_a.inputs_TxD[-1] - head_b.inputs_TxD[-1]).max())
    output_diff = float(np.abs(head_a.outputs_TxD[-1] - head_b.outputs_TxD[-1]).max())
    word_a, word_b = vocab[ids_a[-1]], vocab[ids_b[-1]]
    pos_a, pos_b = len(ids_a) - 1, len(ids_b) - 1
    if word_a == word_b and pos_a == pos_b:
        where = words["context_inputs"].format(word=word_a, pos=pos_a, diff=input_diff)
    else:
        where = words["context_inputs_other"].format(
            a=word_a, pos_a=pos_a, b=word_b, pos_b=pos_b, diff=input_diff
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
        _p(f"{words['context_outputs'].format(diff=output_diff)} ({verdict}).", cls),
    ]


def context_view(state: LabState, fields: dict, lang: str) -> dict:
    words = TEXT[lang]
    heads = []
    for key in ("context_a", "context_b"):
        sentence = fields[key]
        ids_T = compute.parse_sentence(sentence, state.vocab)
        heads.append((sentence.strip(), ids_T, compute.one_head(state.table_VxD, ids_T)))
    texts = [text for text, _, _ in heads]
    inputs_2xD = np.stack([head.inputs_TxD[-1] for _, _, head in heads])
    outputs_2xD = np.stack([head.outputs_TxD[-1] for _, _, head in heads])
    vectors_4xD = np.concatenate([inputs_2xD, outputs_2xD])
    labels = [
        *(words["context_input_row"].format(sentence=text) for text in texts),
        *(words["context_output_row"].format(sentence=text) for text in texts),
    ]
    vectors = matrix_html(
        vectors_4xD,
        labels,
        range(vectors_4xD.shape[1]),
        caption=words["context_vectors"],
        fmt="{:+.4f}",
    )
    figures = {
        f"context_weights_{side}": _weights_figure(
            [state.vocab[i] for i in ids_T],
            head.weights_TxT,
            words["context_weights"].format(sentence=text),
        )
        for side, (text, ids_T, head) in zip("ab", heads, strict=True)
    }
    result = _view(state, *_context_findings(texts, heads, state.vocab, words), vectors)
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
    return {
        "positions_result": _view(None, _p(text, "lab-big")),
        "positions_heatmap": _heatmap_figure(length, dim, pos, pair, words),
        "positions_similarity": _similarity_figure(length, dim, pos, words),
        "positions_clock": _clock_figure(dim, pos, pair, words),
    }


# ----------------------------------------------------------------------------- the actions
# action(state, fields, lang) -> (new state or None if unchanged, note HTML, {widget key: value})
# or an iterator of such triples (a run of steps, shown as it goes).


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
    note = words["rename_applied"].format(
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
        note = words["edit_same"].format(row=row, dim=dim, value=value, positions=positions)
        return None, _p(note, "lab-ok"), {}
    edited_VxD = compute.set_coordinate(state.table_VxD, row, dim, value)
    new_state = state._replace(table_VxD=edited_VxD, last_run=None)
    before_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    after_TxD = np.asarray(compute.lookup(edited_VxD, ids_T[None]))[0]
    changed = compute.changed_positions(before_TxD, after_TxD)
    others = [t for t in range(len(ids_T)) if ids_T[t] != row]
    other = float(np.abs(after_TxD[others] - before_TxD[others]).max()) if others else 0.0
    summary = words["edit_summary"].format(
        row=row, dim=dim, word=state.vocab[row], old=old, new=value
    )
    if changed:
        effect = words["edit_changed"].format(
            positions=", ".join(map(str, changed)), row=row, other=other
        )
    else:
        effect = words["edit_nothing"].format(row=row)
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


def _run(state: LabState, n: int, learning_rate: float, lang: str) -> Iterator:
    """n steps, yielding the state after each of up to RUN_FRAMES chunks."""
    words = TEXT[lang]
    input_id = state.vocab.index(compute.STEP_INPUT)
    before = _stats(state)
    last_run = dict(n=n, p=before.p, loss=before.loss, gap=before.gap, rows=[])
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
            tuple(history),
            {**last_run, "rows": rows},
        )
        note = words["steps_running" if done < n else "steps_done"].format(done=done, n=n)
        yield state, _p(note, "lab-ok"), {}


def step_action(state: LabState, fields: dict, lang: str):
    return _run(state, 1, _learning_rate(fields, lang), lang)


def steps_action(state: LabState, fields: dict, lang: str):
    n = compute.parse_int(fields["step_n"], field="steps", low=1, high=compute.MAX_STEPS)
    return _run(state, n, _learning_rate(fields, lang), lang)


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
    return stored, _p(words["storage_restored"].format(n=stored.steps), "lab-ok"), {}


# ----------------------------------------------------------------------------- the page's parts


def _dashed(key: str) -> str:
    """A component's elem_id: its key with dashes ("lookup_ids" -> "lookup-ids")."""
    return key.replace("_", "-")


class Field(NamedTuple):
    """A textbox labelled TEXT[lang][key]."""

    key: str
    default: str

    def make(self, words: dict):
        return gr.Textbox(
            self.default, label=words[self.key], elem_id=_dashed(self.key), max_lines=1
        )


class Choice(NamedTuple):
    """Radio buttons labelled TEXT[lang][key]; each option is (its text key or text, its value)."""

    key: str
    options: tuple[tuple[str | None, str], ...]
    default: str

    def make(self, words: dict):
        options = [(words.get(text, text), value) for text, value in self.options]
        return gr.Radio(
            options, value=self.default, label=words[self.key], elem_id=_dashed(self.key)
        )


class Slider(NamedTuple):
    """A slider labelled TEXT[lang][key] (its view sets its value, range and label)."""

    key: str
    default: float

    def make(self, words: dict):
        return gr.Slider(
            -SLIDER_RANGE,
            SLIDER_RANGE,
            value=self.default,
            step=0.01,
            label=words[self.key],
            elem_id=_dashed(self.key),
        )


class Button(NamedTuple):
    """A button reading TEXT[lang][key]."""

    key: str
    primary: bool = True
    default: None = None  # a button has no value of its own

    def make(self, words: dict):
        variant = "primary" if self.primary else "secondary"
        return gr.Button(
            words[self.key],
            variant=variant,
            elem_id=_dashed(self.key),
            elem_classes=["lab-button", variant],
        )


class Event(NamedTuple):
    """`trigger`'s `kind` event runs `action`, then the views (see the module's docstring).

    `keep` names outputs this event leaves alone (the slider being dragged)."""

    trigger: str
    action: Callable = show_action
    kind: str = "click"
    trigger_mode: str | None = None
    keep: tuple[str, ...] = ()


class Part(NamedTuple):
    """One part of the page: its words are TEXT[lang]["<name>_heading"] and "<name>_explain"."""

    name: str  # elem_ids part-<name>, <name>-message, <name>-result
    layout: tuple  # widgets in order: a tuple of widgets is one gr.Row, a bare widget stands alone
    view: Callable  # view(state, fields, lang) -> {output key: value}
    events: tuple[Event, ...]
    plots: tuple[str, ...] = ()  # gr.Plot keys (matplotlib), in a row under the result
    line_plots: tuple[str, ...] = ()  # gr.LinePlot keys, under the result
    reads_table: bool = True  # recomputed whenever the shared table changes
    heading_args: Callable[[], dict] | None = None  # fills the heading's {placeholders}
    above: Callable[[dict], str] | None = None  # HTML of the words, above the widgets


def _output_weights_html(words: dict) -> str:
    return matrix_html(
        compute.OUTPUT_WEIGHTS_2xD,
        [f"w_{compute.STEP_TARGET}", f"w_{compute.STEP_RIVAL}"],
        range(compute.OUTPUT_WEIGHTS_2xD.shape[1]),
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
            (Field("edit_value", "0.9"), Button("edit_button")),
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
                Field("step_lr", str(compute.LEARNING_RATE)),
                Button("step_button"),
            ),
            (
                Field("step_n", "50"),
                Button("steps_button"),
                Button("reset_button", primary=False),
            ),
        ),
        step_view,
        (
            Event("step_button", step_action, trigger_mode="multiple"),
            Event("steps_button", steps_action, trigger_mode="multiple"),
            Event("reset_button", reset_action, trigger_mode="multiple"),
        ),
        line_plots=("step_chart",),
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
        (Event("positions_button"),),
        plots=("positions_heatmap", "positions_similarity", "positions_clock"),
        reads_table=False,
    ),
)


def _widgets(layout: tuple):
    """The layout's widgets in order."""
    for item in layout:
        yield from item if type(item) is tuple else (item,)


def _defaults() -> dict:
    """Every widget's starting value by key."""
    return {
        w.key: w.default for part in PARTS for w in _widgets(part.layout) if w.default is not None
    }


def _render(part: Part, state: LabState, fields: dict, lang: str, *, own: bool) -> dict:
    """The part's view. Bad input in another part's fields is that part's message, not an error
    of this event; the part's own bad input raises (nothing changes, its message says why)."""
    try:
        return part.view(state, fields, lang)
    except LabInputError as error:
        if own:
            raise
        cleared = {key: None for key in (*part.plots, *part.line_plots)}
        return {f"{part.name}_result": _view(state, _error_html(error, lang)), **cleared}


class Page(NamedTuple):
    """The built page's components by key, and the language."""

    components: dict
    lang: str

    def fields(self, values: dict) -> dict:
        """The event's input values by key (Gradio passes a set of inputs as a dict)."""
        return {key: values[c] for key, c in self.components.items() if c in values}

    def handler(self, part: Part, event: Event) -> Callable:
        """The Gradio function of one event: action, then views, then outputs by component."""

        def handle(values: dict):
            fields = self.fields(values)
            state = fields["state"]
            try:
                results = event.action(state, fields, self.lang)
                for new_state, note, extra in (
                    results if isinstance(results, Iterator) else [results]
                ):
                    yield self.outputs(part, event, state, new_state, note, fields, extra)
            except LabInputError as error:
                yield {self.components[f"{part.name}_message"]: _error_html(error, self.lang)}
            except Exception as error:  # noqa: BLE001 - no error reaches the page unexplained
                log.exception("lab: %s's %s failed", part.name, event.trigger)
                message = self.components[f"{part.name}_message"]
                yield {message: _unexpected_html(error, self.lang)}

        return handle

    def outputs(self, part, event, state, new_state, note, fields, extra) -> dict:
        """The outputs of one step of an event by component: the new state and every view that
        reads it (or this part's view alone), the widgets the action set, the part's message."""
        fields, out = {**fields, **extra}, {}
        if new_state is not None:
            compute.check_finite(new_state.table_VxD)
            out.update(state=new_state, storage=to_storage(new_state))
            out["table"] = _shared_table_html(new_state)
            for other in PARTS:
                if other.reads_table:
                    out.update(_render(other, new_state, fields, self.lang, own=other is part))
        out.update(_render(part, new_state or state, fields, self.lang, own=True))
        out.update(extra)
        out = {key: value for key, value in out.items() if key not in event.keep}
        out[f"{part.name}_message"] = note
        return {self.components[key]: value for key, value in out.items() if key in self.components}

    def output_components(self, part: Part) -> list:
        """Everything an event of `part` may write: shared state, views, widgets, its message."""
        skip = {f"{other.name}_message" for other in PARTS if other is not part}
        return [c for key, c in self.components.items() if key not in skip]


def _heading(part: Part, words: dict) -> str:
    heading = words[f"{part.name}_heading"]
    if part.heading_args:
        heading = heading.format(**part.heading_args())
    return f"## {heading}"


def _build_widgets(layout: tuple, words: dict) -> dict:
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
    fields = {**_defaults(), "state": start}
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
        for key in part.line_plots:
            components[key] = gr.LinePlot(
                shown[key],
                x="step",
                y="value",
                color="series",
                title=words[key],
                x_title=words["step_axis"],
                y_title=" ",
                color_title=" ",
                x_axis_format="d",
                height=280,
                elem_id=_dashed(key),
                show_label=False,
            )
        if part.plots:
            with gr.Row():
                for key in part.plots:
                    components[key] = gr.Plot(
                        shown[key],
                        elem_id=_dashed(key),
                        show_label=False,
                        min_width=300,
                        elem_classes=["lab-plot"],
                        format="png",
                    )


def build(lang: str = "en") -> gr.Blocks:
    """The lab's Blocks in `lang` (one of LANGUAGES): the shared table, then every part in PARTS."""
    if lang not in LANGUAGES:
        raise ValueError(f"--lang must be one of {', '.join(LANGUAGES)}, got {lang!r}.")
    words = TEXT[lang]
    start = initial_state()
    with gr.Blocks(title=words["title"], analytics_enabled=False) as demo:
        components = {
            "state": gr.State(start),
            "storage": gr.BrowserState(to_storage(start), storage_key=STORAGE_KEY),
        }
        gr.Markdown(f"# {words['title']}\n\n{words['intro']}")
        with gr.Group(elem_id="part-table"):
            gr.Markdown(f"**{words['table_heading']}**")
            components["table"] = gr.HTML(_shared_table_html(start), elem_id="table")
            components["table_message"] = gr.HTML("", elem_id="table-message")
        for part in PARTS:
            _build_part(part, components, start, lang)
        page = Page(components, lang)
        widgets = {w.key for part in PARTS for w in _widgets(part.layout) if w.default is not None}
        inputs = {components[key] for key in ("state", "storage", *widgets)}
        restore = Part("table", (), lambda s, f, lang: {}, (), reads_table=False)
        demo.load(
            page.handler(restore, Event("load", restore_action)),
            inputs,
            page.output_components(restore),
            concurrency_id="lab",
            concurrency_limit=1,
            show_progress="hidden",
        )
        for part in PARTS:
            for event in part.events:
                getattr(components[event.trigger], event.kind)(
                    page.handler(part, event),
                    inputs,
                    page.output_components(part),
                    trigger_mode=event.trigger_mode,
                    concurrency_id="lab",
                    concurrency_limit=1,
                    show_progress="minimal" if event.kind == "click" else "hidden",
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
    demo.queue(default_concurrency_limit=4)
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        quiet=True,
        prevent_thread_lock=True,
        theme=_THEME,
        css=_CSS,
        js=_lang_js(lang),
        footer_links=[],
    )
    print(f"minigpt-jax lab: {url} (Ctrl-C stops it)", flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        demo.block_thread()
    finally:
        demo.close()
