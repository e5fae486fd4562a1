"""The lab's figures, read back from what they draw: the step chart's axes, the clock's hands and
legend, the attention heatmap's masked cells (issue 55, item 7)."""

import html
import re

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg

from minigpt_apps.lab import compute, figures
from minigpt_apps.lab.text import TEXT


def _attributes(tag: str) -> dict:
    return dict(re.findall(r'([\w-]+)="([^"]*)"', tag))


def _polylines(svg: str) -> list[np.ndarray]:
    """Each <polyline>'s points, (N, 2) pixels, in drawing order."""
    return [
        np.array([[float(v) for v in point.split(",")] for point in points.split()])
        for points in re.findall(r'<polyline points="([^"]*)"', svg)
    ]


def test_after_lr_minus_2_times_10_steps_p_keeps_its_own_0_to_1_axis():
    """Ascent at lr −2 drives the loss to 50.7 in 10 steps; p(zamek) is drawn on an axis of its
    own from 0 to 1 (p = 0.470 at step 0 at 47% of the plot's height, where one 0-53 axis put it
    at 0.9%), the loss on a right axis whose ticks reach 50."""
    run = compute.train_steps(compute.TABLE_VxD, compute.OUTPUT_WEIGHTS_2xD, 1, -2.0, 10)
    assert run.loss_Q1[-1] > 50.0 and abs(run.p_Q1[0] - 0.470) < 1e-3  # the case
    points = [(k, float(p), float(loss)) for k, (p, loss) in enumerate(zip(*run[1:], strict=True))]
    svg = figures.chart_svg(points, TEXT["es"])
    frame = _attributes(re.search(r'<rect [^>]*stroke="#444"[^>]*/>', svg).group(0))
    top, height = float(frame["y"]), float(frame["height"])
    p_line, loss_line = _polylines(svg)
    expected_y = top + height * (1.0 - run.p_Q1)  # a linear 0-1 axis, top = 1
    np.testing.assert_allclose(p_line[:, 1], expected_y, atol=0.06)  # pixels, to 0.1 as written
    assert p_line[0, 1] - top < 0.6 * height  # step 0's p stands above the floor's last 40%
    assert (loss_line[:, 1] >= top - 0.1).all() and (loss_line[:, 1] <= top + height).all()
    texts = [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
    assert "50" in texts and "1,0" in texts, texts  # the loss's axis and p's, Spanish numbers


def _drawn(figure):
    FigureCanvasAgg(figure).draw()
    return figure


def test_the_clock_draws_every_pair_of_a_narrow_table_and_its_legend_beside_the_circle():
    """D = 16 has 8 pairs: 8 hands (the page drew pairs 0-5 at any width); the legend's box
    and the circle's box do not meet (the legend sat on the circle's lower right)."""
    figure = _drawn(figures.clock_figure(16, 3, 2, TEXT["en"]))
    ax = figure.axes[0]
    assert [line.get_label() for line in ax.lines] == [f"i={i}" for i in range(8)]
    assert [line.get_linewidth() for line in ax.lines].count(4) == 1  # pair 2, the chosen one
    legend = figure.legends[0].get_window_extent()
    circle = ax.patches[0].get_window_extent()
    assert legend.x0 > circle.x1 or legend.y1 < circle.y0, (legend, circle)
    assert figure.bbox.contains(legend.x1 - 1, legend.y1 - 1)  # and on the figure


def test_the_clock_of_a_wide_table_spreads_its_hands_and_says_so():
    """D = 512 (256 pairs): 16 hands spread from pair 0 to pair 255, plus the chosen pair 100,
    and the title says 17 of the 256 pairs are drawn."""
    figure = _drawn(figures.clock_figure(512, 40, 100, TEXT["es"]))
    shown = [int(line.get_label()[2:]) for line in figure.axes[0].lines]
    assert len(shown) == 17 and shown[0] == 0 and shown[-1] == 255 and 100 in shown, shown
    assert np.all(np.diff(shown) > 0) and max(np.diff(shown)) <= 17, shown
    assert "17 de los 256 pares" in " ".join(figure.get_suptitle().split())
    hands_Px2 = compute.clock_hands(40, 512)
    for line, pair in zip(figure.axes[0].lines, shown, strict=True):  # each hand's direction
        x, y = line.get_xdata()[1], line.get_ydata()[1]
        np.testing.assert_allclose(np.arctan2(x, y), np.arctan2(*hands_Px2[pair]), atol=1e-6)


def _heatmap_cells(svg: str) -> dict:
    """{(row, column): (fill, printed number or None)} of a heatmap's cells, read by position."""
    rects = [
        _attributes(tag)
        for tag in re.findall(r"<rect [^>]*/>", svg)
        if "x=" in tag and 'width="12"' not in tag  # not the background, not the colour bar
    ]
    xs = sorted({float(r["x"]) for r in rects})
    ys = sorted({float(r["y"]) for r in rects})
    cells = {(ys.index(float(r["y"])), xs.index(float(r["x"]))): [r["fill"], None] for r in rects}
    for tag, number in re.findall(r'(<text [^>]*fill="(?:white|black)"[^>]*>)([^<]*)</text>', svg):
        at = _attributes(tag)
        x, y = float(at["x"]), float(at["y"])
        column = max(k for k, left in enumerate(xs) if left <= x)
        row = max(k for k, top in enumerate(ys) if top <= y)
        cells[row, column][1] = number
    return {key: tuple(value) for key, value in cells.items()}


def test_masked_future_cells_print_no_number_and_a_real_zero_still_prints():
    """The causal head's weights over 'oto kamienny zamek': the three cells above the diagonal
    are hatched with no number (they printed '0,00'); the six below print their weights; a weight
    that is really 0 (set here in a lower cell) still prints '0,00' in its colour."""
    head = compute.one_head(compute.TABLE_VxD, np.array([0, 1, 2]))
    weights_TxT = np.asarray(head.weights_TxT, np.float64)
    np.testing.assert_array_equal(np.triu(weights_TxT, 1), 0.0)  # the mask's zeros
    words = TEXT["es"]
    svg = figures.weights_svg(["oto", "kamienny", "zamek"], weights_TxT, "A", words)
    cells = _heatmap_cells(svg)
    assert len(cells) == 9
    for (row, column), (fill, number) in cells.items():
        if column > row:
            assert (fill, number) == ("url(#lab-mask)", None), (row, column)
        else:
            assert number == f"{weights_TxT[row, column]:.2f}".replace(".", ","), (row, column)
    title = " ".join(html.unescape(t) for t in re.findall(r'font-weight="600">([^<]*)<', svg))
    assert title.endswith(words["context_mask_note"]), title
    weights_TxT[2] = [0.0, 0.4, 0.6]
    svg = figures.weights_svg(["oto", "kamienny", "zamek"], weights_TxT, "A", words)
    cells = _heatmap_cells(svg)
    assert cells[2, 0] == ("#f7fbff", "0,00")  # blues' white: a real zero, not the hatching
