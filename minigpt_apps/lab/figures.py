"""The lab page's figures: matplotlib's (the positions) and `lab.svg`'s (the rest), each an SVG
image with its alt text."""

from __future__ import annotations

import base64
import io
import textwrap

import matplotlib
import matplotlib.patches
import matplotlib.ticker
import numpy as np

from minigpt_apps.lab import compute, svg
from minigpt_apps.lab.markup import escape, step_words
from minigpt_apps.lab.state import LabState
from minigpt_apps.lab.text import Words

matplotlib.use("Agg")  # figures are rendered to SVG for the page, never shown in a window

from matplotlib.figure import Figure  # noqa: E402

# Each figure goes to the page as an SVG <img> with alt text in the page's language (its text
# stays text, so the tests read the axes), its tick labels in that language's numbers.


def clip(text: str, limit: int) -> str:
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
        f'<div class="lab-plot"><img{ident} class="lab-figure" alt="{escape(alt)}" '
        f'src="data:image/svg+xml;base64,{data}"></div>'
    )


def weights_svg(tokens, weights_TxT, title: str, words: Words, *, causal: bool = True) -> str:
    """Attention weights as a heatmap (row: query, column: key); words label the axes up to 10
    tokens, position numbers (every k-th) beyond. With `causal`, the future keys (column > row)
    are masked: hatched, no number."""
    long = len(tokens) > 10
    masked_TxT = np.triu(np.ones((len(tokens), len(tokens)), bool), 1) if causal else None
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
        masked_RxC=masked_TxT,
        mask_note=words["context_mask_note"],
    )


def points_svg(state: LabState, points_Vx2, words: Words) -> str:
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


def cosine_svg(state: LabState, cosine_VxV, words: Words) -> str:
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


def chart_svg(points, words: Words) -> str:
    """p(target) on the left axis (0 to 1) and the loss on its own right axis after each step
    taken (a marker per point: step 0 shows, too); one shared axis let a loss of 50 press p
    onto the floor."""
    steps = [s for s, _, _ in points]
    return svg.lines(
        [(words.f("step_p", **step_words()), steps, [p for _, p, _ in points])],
        right=(words["step_loss"], steps, [loss for _, _, loss in points]),
        title=words["step_chart"],
        xlabel=words["step_axis"],
        num=words.num,
    )


def heatmap_figure(length: int, dim: int, pos: int, pair: int, words: Words) -> Figure:
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


def similarity_figure(length: int, dim: int, pos: int, words: Words) -> Figure:
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


MAX_CLOCK_HANDS = 16  # hands on the clock; a wider table shows this many, evenly spread


def clock_pairs(pairs: int, chosen: int) -> list[int]:
    """The pairs the clock draws: all `pairs` up to MAX_CLOCK_HANDS, else that many spread
    evenly from the first to the last, and always the chosen one."""
    if pairs <= MAX_CLOCK_HANDS:
        return list(range(pairs))
    spread = np.linspace(0, pairs - 1, MAX_CLOCK_HANDS).round().astype(int).tolist()
    return sorted({*spread, chosen})


def clock_figure(dim: int, pos: int, pair: int, words: Words) -> Figure:
    """The pairs of `clock_pairs` at `pos` as clock hands, the chosen one thick; the legend
    beside the circle, never on it."""
    hands_Px2 = compute.clock_hands(pos, dim)
    shown = clock_pairs(len(hands_Px2), pair)
    figure = _figure(4.2, 3.8)
    ax = figure.subplots()
    ax.add_patch(matplotlib.patches.Circle((0, 0), 1, fill=False, color="grey"))
    colours = matplotlib.colormaps["tab20"].colors
    for k, i in enumerate(shown):
        sin, cos = hands_Px2[i]
        length_k = 1.0 - 0.65 * k / max(1, len(shown) - 1)  # nested hands stay distinguishable
        ax.plot(
            [0, length_k * sin],
            [0, length_k * cos],
            lw=4 if i == pair else 1.5,
            color=colours[k % len(colours)],
            label=f"i={i}",
        )
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(-1.1, 1.1)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    figure.legend(loc="outside right center", fontsize=7, handlelength=1.2, labelspacing=0.3)
    title = words.f("positions_clock", pos=pos)
    if len(shown) < len(hands_Px2):
        title += " " + words.f("positions_clock_some", shown=len(shown), pairs=len(hands_Px2))
    figure.suptitle(_wrapped(title, 44), fontsize=10)
    return figure
