"""Small SVG charts for the lab page, written directly (no plotting library): a heatmap, a
scatter of labelled points and a line chart. They re-render on every change of the shared
table, where matplotlib took 0.3-0.5 s a figure on the 2-core machine; these take milliseconds.

Every number is written by the caller's `num(value, spec)`, so the axes follow the page's
language (a decimal comma in Spanish). Text stays text (<text> elements), which the tests read.
"""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Callable, Sequence

import numpy as np

WIDTH, HEIGHT = 420, 340
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def _e(text) -> str:
    return html.escape(str(text))


def _mix(a: str, b: str, t: float) -> str:
    ca = [int(a[i : i + 2], 16) for i in (1, 3, 5)]
    cb = [int(b[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb, strict=True))


def color(value: float, low: float, high: float, scheme: str) -> str:
    """A cell's fill: "blues" from white to dark blue, "diverging" blue - white - red."""
    t = 0.0 if high == low else min(1.0, max(0.0, (value - low) / (high - low)))
    if scheme == "blues":
        return _mix("#f7fbff", "#08306b", t)
    return _mix("#2166ac", "#f7f7f7", 2 * t) if t < 0.5 else _mix("#f7f7f7", "#b2182b", 2 * t - 1)


def _svg(body: list[str], title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    lines = textwrap.wrap(title, 52) or [""]
    heading = "".join(
        f'<text x="{width / 2}" y="{14 + 13 * k}" text-anchor="middle" font-size="11" '
        f'font-weight="600">{_e(line)}</text>'
        for k, line in enumerate(lines)
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" font-family="system-ui, sans-serif">'
        f'<rect width="{width}" height="{height}" fill="white"/>{heading}{"".join(body)}</svg>'
    )


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    span = high - low or 1.0
    step = 10 ** math.floor(math.log10(span / count))
    for factor in (1, 2, 2.5, 5, 10):
        if span / (step * factor) <= count + 1:
            step *= factor
            break
    first = math.ceil(low / step - 1e-9) * step
    return [first + k * step for k in range(int((high - first) / step + 1e-9) + 1)]


def _decimals(ticks: Sequence[float]) -> int:
    """Decimals that write every tick exactly (0.25 needs 2)."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    digits = max(0, -math.floor(math.log10(step) + 1e-9))
    while digits < 6 and abs(round(step, digits) - step) > 1e-9:
        digits += 1
    return digits


# A masked cell's fill: grey hatching, which no value's colour is.
MASK_PATTERN = (
    '<defs><pattern id="lab-mask" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#e5e5e5"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#a3a3a3" stroke-width="2"/></pattern></defs>'
)


def heatmap(
    values_RxC,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    title: str,
    scheme: str,
    low: float,
    high: float,
    num: Callable[[float, str], str],
    cell_spec: str | None = None,
    xlabel: str = "",
    ylabel: str = "",
    masked_RxC=None,
    mask_note: str = "",
) -> str:
    """A heatmap with labelled rows and columns (at most 10 labels each: every k-th beyond).
    Cells where `masked_RxC` is True are hatched grey with no number (a masked weight is no
    weight, unlike a real 0.00); `mask_note`, said under the title, tells what the hatching is."""
    values_RxC = np.asarray(values_RxC, np.float64)
    rows, cols = values_RxC.shape
    masked_RxC = np.zeros((rows, cols), bool) if masked_RxC is None else np.asarray(masked_RxC)
    title = f"{title}. {mask_note}" if mask_note and masked_RxC.any() else title
    top, left, size = 40 + 13 * (len(textwrap.wrap(title, 52)) - 1), 78, 260
    cell_w, cell_h = size / cols, (HEIGHT - top - 70) / rows
    body = [MASK_PATTERN] if masked_RxC.any() else []
    for r in range(rows):
        for c in range(cols):
            value = values_RxC[r, c]
            x, y = left + c * cell_w, top + r * cell_h
            fill = "url(#lab-mask)" if masked_RxC[r, c] else color(value, low, high, scheme)
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{cell_w + 0.3:.1f}" '
                f'height="{cell_h + 0.3:.1f}" fill="{fill}"/>'
            )
            if masked_RxC[r, c]:
                continue
            if cell_spec and rows <= 8 and cols <= 8:
                dark = (value - low) / (high - low or 1) > 0.75 or (
                    scheme != "blues" and abs(value) > 0.6 * max(abs(low), abs(high))
                )
                body.append(
                    f'<text x="{x + cell_w / 2:.1f}" y="{y + cell_h / 2 + 3:.1f}" font-size="9" '
                    f'text-anchor="middle" fill="{"white" if dark else "black"}">'
                    f"{_e(num(value, cell_spec))}</text>"
                )
    stride_r, stride_c = math.ceil(rows / 10), math.ceil(cols / 10)
    for r in range(0, rows, stride_r):
        y = top + (r + 0.5) * cell_h + 3
        body.append(
            f'<text x="{left - 4}" y="{y:.1f}" font-size="9" text-anchor="end">'
            f"{_e(row_labels[r])}</text>"
        )
    base = top + rows * cell_h + 10
    for c in range(0, cols, stride_c):
        x = left + (c + 0.5) * cell_w
        body.append(
            f'<text x="{x:.1f}" y="{base:.1f}" font-size="9" text-anchor="end" '
            f'transform="rotate(-40 {x:.1f} {base:.1f})">{_e(col_labels[c])}</text>'
        )
    if xlabel:
        body.append(
            f'<text x="{left + size / 2}" y="{HEIGHT - 6}" font-size="10" '
            f'text-anchor="middle">{_e(xlabel)}</text>'
        )
    if ylabel:
        body.append(
            f'<text x="12" y="{top + rows * cell_h / 2:.1f}" font-size="10" text-anchor="middle" '
            f'transform="rotate(-90 12 {top + rows * cell_h / 2:.1f})">{_e(ylabel)}</text>'
        )
    # The colour bar, its ticks in the page's numbers.
    bar_x, bar_h = left + size + 22, rows * cell_h
    for k in range(40):
        value = high - (high - low) * (k + 0.5) / 40
        body.append(
            f'<rect x="{bar_x}" y="{top + k * bar_h / 40:.1f}" width="12" '
            f'height="{bar_h / 40 + 0.3:.1f}" fill="{color(value, low, high, scheme)}"/>'
        )
    ticks = _ticks(low, high, 4)
    digits = _decimals(ticks)
    for tick in ticks:
        y = top + (high - tick) / (high - low or 1) * bar_h + 3
        body.append(
            f'<text x="{bar_x + 16}" y="{y:.1f}" font-size="9">'
            f"{_e(num(tick + 0.0, f'.{digits}f'))}</text>"
        )
    return _svg(body, title)


class _Axes:
    """A plot area mapping data to pixels, with ticks in the page's numbers."""

    def __init__(
        self, xlim, ylim, top: float, num, *, integer_x: bool = False, right_margin: float = 14
    ):
        self.left, self.right, self.top, self.bottom = 52, WIDTH - right_margin, top, HEIGHT - 40
        self.xlim, self.ylim, self.num, self.integer_x = xlim, ylim, num, integer_x

    def x(self, value: float) -> float:
        low, high = self.xlim
        return self.left + (value - low) / (high - low or 1) * (self.right - self.left)

    def y(self, value: float, ylim=None) -> float:
        """The pixel row of `value` on the left axis (or on an axis spanning `ylim`)."""
        low, high = ylim or self.ylim
        return self.bottom - (value - low) / (high - low or 1) * (self.bottom - self.top)

    def right_axis(self, ylim, label: str, colour: str) -> list[str]:
        """A second y axis on the right, spanning `ylim`, its ticks and label in `colour`."""
        ticks = _ticks(*ylim)
        digits = _decimals(ticks)
        out = []
        for tick in ticks:
            y = self.y(tick, ylim)
            out.append(
                f'<line x1="{self.right}" x2="{self.right + 4}" y1="{y:.1f}" y2="{y:.1f}" '
                f'stroke="{colour}"/><text x="{self.right + 6}" y="{y + 3:.1f}" font-size="9" '
                f'fill="{colour}">{_e(self.num(tick + 0.0, f".{digits}f"))}</text>'
            )
        middle_y, x = (self.top + self.bottom) / 2, WIDTH - 8
        out.append(
            f'<text x="{x}" y="{middle_y}" font-size="10" text-anchor="middle" fill="{colour}" '
            f'transform="rotate(90 {x} {middle_y})">{_e(label)}</text>'
        )
        return out

    def frame(self, xlabel: str, ylabel: str) -> list[str]:
        out = [
            f'<rect x="{self.left}" y="{self.top}" width="{self.right - self.left}" '
            f'height="{self.bottom - self.top}" fill="none" stroke="#444"/>'
        ]
        xticks = _ticks(*self.xlim)
        if self.integer_x:
            xticks = sorted({round(t) for t in xticks if abs(t - round(t)) < 1e-9})
        digits = 0 if self.integer_x else _decimals(xticks)
        for tick in xticks:
            x = self.x(tick)
            out.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.bottom}" y2="{self.bottom + 4}" '
                f'stroke="#444"/><text x="{x:.1f}" y="{self.bottom + 15}" font-size="9" '
                f'text-anchor="middle">{_e(self.num(tick + 0.0, f".{digits}f"))}</text>'
            )
        yticks = _ticks(*self.ylim)
        digits = _decimals(yticks)
        for tick in yticks:
            y = self.y(tick)
            out.append(
                f'<line x1="{self.left - 4}" x2="{self.left}" y1="{y:.1f}" y2="{y:.1f}" '
                f'stroke="#444"/><text x="{self.left - 6}" y="{y + 3:.1f}" font-size="9" '
                f'text-anchor="end">{_e(self.num(tick + 0.0, f".{digits}f"))}</text>'
            )
        middle_x, middle_y = (self.left + self.right) / 2, (self.top + self.bottom) / 2
        out.append(
            f'<text x="{middle_x}" y="{HEIGHT - 8}" font-size="10" text-anchor="middle">'
            f"{_e(xlabel)}</text>"
        )
        if ylabel:
            out.append(
                f'<text x="12" y="{middle_y}" font-size="10" text-anchor="middle" '
                f'transform="rotate(-90 12 {middle_y})">{_e(ylabel)}</text>'
            )
        return out


def scatter(points_Nx2, labels: Sequence[str], *, title, xlabel, ylabel, lim, num) -> str:
    """Labelled points (labels alternate sides in height order, so neighbours do not stack)."""
    top = 40 + 13 * (len(textwrap.wrap(title, 52)) - 1)
    axes = _Axes(lim, lim, top, num)
    body = axes.frame(xlabel, ylabel)
    body.append(
        f'<line x1="{axes.x(0):.1f}" x2="{axes.x(0):.1f}" y1="{axes.top}" y2="{axes.bottom}" '
        f'stroke="#bbb"/><line x1="{axes.left}" x2="{axes.right}" y1="{axes.y(0):.1f}" '
        f'y2="{axes.y(0):.1f}" stroke="#bbb"/>'
    )
    points_Nx2 = np.asarray(points_Nx2, np.float64)
    for rank, i in enumerate(np.argsort(points_Nx2[:, 1])):
        x, y = axes.x(points_Nx2[i, 0]), axes.y(points_Nx2[i, 1])
        dx, anchor = (7, "start") if rank % 2 == 0 else (-7, "end")
        body.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{x + dx:.1f}" y="{y + 3:.1f}" font-size="9" text-anchor="{anchor}">'
            f"{_e(labels[i])}</text>"
        )
    return _svg(body, title)


def lines(series, *, title: str, xlabel: str, num, right=None) -> str:
    """Lines over integer x (steps), one per (name, xs, ys) on the left axis (0 to at least 1),
    and `right`'s (name, xs, ys) on an axis of its own on the right (0 to its largest value), so
    a loss of 50 leaves a probability its whole 0-1 height; a marker per point up to 30."""
    xs_all = [x for _, xs, _ in [*series, *([right] if right else [])] for x in xs]
    low_x, high_x = min(xs_all), max(xs_all)
    if high_x == low_x:  # one point: an axis from it to the next step (never "−1 steps")
        low_x, high_x = low_x, low_x + 1

    def span(ys) -> tuple[float, float]:
        return (0.0, max(1.0, max(ys) * 1.05))

    top = 40 + 13 * (len(textwrap.wrap(title, 52)) - 1)
    left_ylim = span([y for _, _, ys in series for y in ys])
    axes = _Axes(
        (low_x, high_x), left_ylim, top, num, integer_x=True, right_margin=40 if right else 14
    )
    body = axes.frame(xlabel, series[0][0] if right and len(series) == 1 else "")
    drawn = [(name, xs, ys, left_ylim) for name, xs, ys in series]
    if right:
        right_ylim = span(right[2])
        body += axes.right_axis(right_ylim, right[0], PALETTE[len(series)])
        drawn.append((*right, right_ylim))
    for k, (name, xs, ys, ylim) in enumerate(drawn):
        colour = PALETTE[k]
        points = [(axes.x(x), axes.y(y, ylim)) for x, y in zip(xs, ys, strict=True)]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        if len(xs) <= 30:
            body.extend(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in points
            )
        legend_y = axes.top + 14 + 14 * k
        body.append(
            f'<line x1="{axes.right - 120}" x2="{axes.right - 104}" y1="{legend_y - 3}" '
            f'y2="{legend_y - 3}" stroke="{colour}" stroke-width="2"/>'
            f'<text x="{axes.right - 100}" y="{legend_y}" font-size="9">{_e(name)}</text>'
        )
    return _svg(body, title)
