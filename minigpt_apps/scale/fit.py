"""Scaling-law fits with bootstrap intervals (numpy and scipy only; no JAX, no files).

(a) IsoFLOP (Hoffmann et al. 2022, approach 2): per budget C, a parabola of the loss in ln N
    through that budget's runs; its vertex is N_opt(C) (D_opt(C) read off the budget's own
    ln D-vs-ln N line there); then N_opt ∝ C^a and D_opt ∝ C^b by least squares in logs.
(b) Parametric (approach 3): L(N, D) = E + A/N^α + B/D^β, fitted in logs, ln L̂ =
    LSE(ln A − α ln N, ln B − β ln D, ln E), with a Huber loss (δ = 1e-3) on ln L̂ − ln L,
    by BFGS from many starts: the best of Hoffmann et al.'s 4,500-point grid of starts
    by their objective, then the best of those minima (as Besiroglu et al. 2024 refitted it).
Intervals: percentile bootstrap over runs (each budget's runs resampled within the budget,
so every replicate is an IsoFLOP grid of the same design), refitting everything per replicate.
A fit that the points cannot pin down is `NotIdentified`, with the reason, never numbers.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from scipy import optimize

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, appendix D.2
LEVEL = 0.95  # the intervals' nominal coverage
MIN_PARAMETRIC_RUNS = 8  # 5 parameters and a few degrees of freedom to judge them
# Hoffmann et al.'s grid of starts: α, β ∈ {0, .5, 1, 1.5, 2}, e ∈ {−1, −.5, 0, .5, 1},
# a, b ∈ {0, 5, 10, 15, 20, 25} (a = ln A, b = ln B, e = ln E).
START_GRID = np.array(
    list(
        itertools.product(
            np.arange(-1.0, 1.01, 0.5),
            np.arange(0.0, 25.1, 5.0),
            np.arange(0.0, 25.1, 5.0),
            np.arange(0.0, 2.01, 0.5),
            np.arange(0.0, 2.01, 0.5),
        )
    )
)  # rows (e, a, b, α, β)
RANGES = [(-5.0, 5.0), (-20.0, 60.0), (-20.0, 60.0), (1e-3, 4.0), (1e-3, 4.0)]  # plausible θ
N_STARTS = 16  # the grid's best starts run to a minimum
PARAMETERS = ("E", "A", "B", "alpha", "beta")


class NotIdentified(ValueError):
    """The points cannot pin this fit down (too few budgets or sizes, no interior minimum)."""


@dataclasses.dataclass(frozen=True)
class Interval:
    """A value and its percentile-bootstrap interval (`replicates` of `requested` worked)."""

    value: float
    low: float
    high: float
    replicates: int
    requested: int

    def holds(self, x: float) -> bool:
        return self.low <= x <= self.high

    def text(self, fmt: str = ".3g") -> str:
        return f"{self.value:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}]"


def _interval(value: float, draws: list[float], requested: int) -> Interval:
    if not draws:
        return Interval(value, float("nan"), float("nan"), 0, requested)
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Interval(float(value), float(low), float(high), len(draws), requested)


# ----------------------------------------------------------------------------- (a) IsoFLOP


@dataclasses.dataclass(frozen=True)
class Vertex:
    """A budget's parabola in ln N and its vertex."""

    budget: float
    coeffs: tuple[float, float, float]  # loss = c2·x² + c1·x + c0, x = ln N
    log_n_opt: float
    log_d_opt: float
    loss_opt: float


def vertex(
    budget: float, n: np.ndarray, d: np.ndarray, loss: np.ndarray, span: np.ndarray | None = None
) -> Vertex:
    """The IsoFLOP minimum of one budget's runs; NotIdentified unless 3 sizes or more give a
    parabola open upward whose vertex lies among the sizes trained (`span`: the sizes of the
    whole budget, when `n` is a bootstrap draw of them)."""
    x, logd = np.log(n), np.log(d)
    span = x if span is None else np.log(span)
    if len(np.unique(x)) < 3:
        raise NotIdentified(f"budget {budget:.3g}: {len(np.unique(x))} sizes; a parabola needs 3")
    c2, c1, c0 = np.polyfit(x, loss, 2)
    if not c2 > 0:
        raise NotIdentified(f"budget {budget:.3g}: the loss is not convex in ln N (no minimum)")
    x_opt = -c1 / (2 * c2)
    if not span.min() <= x_opt <= span.max():
        side = "smallest" if x_opt < span.min() else "largest"
        raise NotIdentified(
            f"budget {budget:.3g}: the minimum lies beyond the {side} size trained; widen sizes"
        )
    slope, intercept = np.polyfit(x, logd, 1)
    loss_opt = c2 * x_opt**2 + c1 * x_opt + c0
    return Vertex(budget, (c2, c1, c0), float(x_opt), float(slope * x_opt + intercept), loss_opt)


@dataclasses.dataclass(frozen=True)
class Frontier:
    """N_opt = exp(n0)·C^a and D_opt = exp(d0)·C^b, with intervals, from the vertices."""

    vertices: list[Vertex]
    a: Interval
    b: Interval
    log_n0: float
    log_d0: float
    replicates: list[tuple[float, float, float, float]]  # (a, n0, b, d0) per bootstrap draw

    def n_opt(self, budget: float) -> Interval:
        return self._at(budget, 0)

    def d_opt(self, budget: float) -> Interval:
        return self._at(budget, 2)

    def _at(self, budget: float, i: int) -> Interval:
        x = np.log(budget)
        value = np.exp((self.log_n0, self.log_d0)[i // 2] + (self.a, self.b)[i // 2].value * x)
        draws = [float(np.exp(r[i + 1] + r[i] * x)) for r in self.replicates]
        return _interval(float(value), draws, self.a.requested)


def _draw(rng, rows: np.ndarray, n: np.ndarray) -> np.ndarray:
    """`rows` drawn with replacement, drawn again (up to 100 times) until they hold 3 sizes:
    the bootstrap conditioned on draws a parabola can be fitted to."""
    for _ in range(100):
        drawn = rng.choice(rows, size=len(rows))
        if len(np.unique(n[drawn])) >= 3:
            break
    return drawn


def _power_laws(vertices: list[Vertex]) -> tuple[float, float, float, float]:
    log_c = np.log([v.budget for v in vertices])
    a, n0 = np.polyfit(log_c, [v.log_n_opt for v in vertices], 1)
    b, d0 = np.polyfit(log_c, [v.log_d_opt for v in vertices], 1)
    return float(a), float(n0), float(b), float(d0)


def fit_frontier(
    budgets, n, d, loss, *, bootstrap: int = 1000, seed: int = 0
) -> tuple[Frontier | None, list[str]]:
    """The IsoFLOP frontier (None when not identified) and the reasons it or a budget's vertex
    is not identified. Needs 3 budgets with a vertex: a line through 2 has no scatter to show."""
    budgets, n, d, loss = (np.asarray(v, dtype=float) for v in (budgets, n, d, loss))
    vertices, notes = [], []
    for c in np.unique(budgets):
        try:
            vertices.append(vertex(c, n[budgets == c], d[budgets == c], loss[budgets == c]))
        except NotIdentified as why:
            notes.append(str(why))
    if len(vertices) < 3:
        notes.append(
            f"N_opt(C) not identified: {len(vertices)} of the budgets have a minimum; it needs 3"
        )
        return None, notes
    kept = np.isin(budgets, [v.budget for v in vertices])
    budgets, n, d, loss = budgets[kept], n[kept], d[kept], loss[kept]
    a, n0, b, d0 = _power_laws(vertices)
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(budgets == v.budget) for v in vertices]
    draws = []
    for _ in range(bootstrap):
        try:
            drawn = []
            for v, g in zip(vertices, groups, strict=True):
                rows = _draw(rng, g, n)
                drawn.append(vertex(v.budget, n[rows], d[rows], loss[rows], span=n[g]))
            draws.append(_power_laws(drawn))
        except NotIdentified:
            continue  # a draw whose parabola has no minimum among the sizes: counted as lost
    if len(draws) < bootstrap / 2:
        notes.append(
            f"N_opt(C) not identified: only {len(draws)} of {bootstrap} bootstrap draws found "
            "a minimum among the sizes in every budget"
        )
        return None, notes
    frontier = Frontier(
        vertices,
        _interval(a, [r[0] for r in draws], bootstrap),
        _interval(b, [r[2] for r in draws], bootstrap),
        n0,
        d0,
        draws,
    )
    return frontier, notes


# ----------------------------------------------------------------------------- (b) parametric


def _objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray):
    """Σ Huber(ln L̂ − ln L) / δ and its gradient in θ = (e, a, b, α, β)."""
    e, a, b, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    top = terms.max(axis=0)
    weights = np.exp(terms - top)
    total = weights.sum(axis=0)
    residual = top + np.log(total) - log_l
    weights /= total
    small = np.abs(residual) <= HUBER_DELTA
    value = np.where(small, 0.5 * residual**2, HUBER_DELTA * (np.abs(residual) - 0.5 * HUBER_DELTA))
    slope = np.where(small, residual, HUBER_DELTA * np.sign(residual))
    grad = np.array(
        [
            (slope * weights[2]).sum(),
            (slope * weights[0]).sum(),
            (slope * weights[1]).sum(),
            -(slope * weights[0] * log_n).sum(),
            -(slope * weights[1] * log_d).sum(),
        ]
    )
    return value.sum() / HUBER_DELTA, grad / HUBER_DELTA


def _grid_values(log_n, log_d, log_l) -> np.ndarray:
    e, a, b, alpha, beta = (START_GRID[:, i : i + 1] for i in range(5))
    log_pred = np.logaddexp(np.logaddexp(a - alpha * log_n, b - beta * log_d), e)
    r = np.abs(log_pred - log_l)
    small = r <= HUBER_DELTA
    return np.where(small, 0.5 * r**2, HUBER_DELTA * (r - 0.5 * HUBER_DELTA)).sum(axis=1)


def _minimize(starts, log_n, log_d, log_l) -> tuple[np.ndarray, float]:
    # BFGS (Besiroglu et al.'s choice): L-BFGS-B's BLAS calls oversubscribe a shared CPU, and
    # the bounds are checked on the result instead (_off_range).
    best, best_value = None, np.inf
    for start in starts:
        result = optimize.minimize(
            _objective,
            start,
            args=(log_n, log_d, log_l),
            jac=True,
            method="BFGS",
            options={"gtol": 1e-8, "maxiter": 2000},
        )
        if np.all(np.isfinite(result.x)) and result.fun < best_value:
            best, best_value = result.x, float(result.fun)
    return best, best_value


def law(theta: np.ndarray, n, d) -> np.ndarray:
    """L(N, D) of θ = (e, a, b, α, β)."""
    e, a, b, alpha, beta = theta
    return (
        np.exp(e)
        + np.exp(a) * np.asarray(n, float) ** -alpha
        + np.exp(b) * np.asarray(d, float) ** -beta
    )


@dataclasses.dataclass(frozen=True)
class Parametric:
    """The fitted L(N, D), every parameter with its interval, the bootstrap's θs and each one's
    log residuals (for predictive intervals)."""

    theta: np.ndarray
    params: dict[str, Interval]  # E, A, B, alpha, beta
    replicates: list[np.ndarray]
    residuals: list[np.ndarray]  # per replicate: ln L − ln L̂ on the runs it drew
    own_residuals: np.ndarray

    def loss(self, n: float, d: float, seed: int = 0) -> Interval:
        """L(n, d) with a predictive interval: each replicate's curve times the exp of one of
        its own residuals drawn at random (the run-to-run scatter a measurement carries)."""
        rng = np.random.default_rng(seed)
        draws = [
            float(law(t, n, d) * np.exp(rng.choice(r)))
            for t, r in zip(self.replicates, self.residuals, strict=True)
        ]
        return _interval(float(law(self.theta, n, d)), draws, self.params["E"].requested)

    def exponent(self) -> Interval:
        """a = β/(α+β) of N_opt ∝ C^a under C = 6ND, with its interval."""
        draws = [float(t[4] / (t[3] + t[4])) for t in self.replicates]
        value = float(self.theta[4] / (self.theta[3] + self.theta[4]))
        return _interval(value, draws, self.params["E"].requested)

    def optimum(self, budget: float) -> tuple[float, float]:
        """(N_opt, D_opt) of this law at `budget` under C = 6·N·D (Hoffmann et al., eq. 4)."""
        e, a, b, alpha, beta = self.theta
        g = (alpha * np.exp(a) / (beta * np.exp(b))) ** (1 / (alpha + beta))
        n_opt = g * (budget / 6) ** (beta / (alpha + beta))
        return float(n_opt), float(budget / 6 / n_opt)


def _fit_theta(log_n, log_d, log_l, starts) -> np.ndarray:
    theta, _ = _minimize(starts, log_n, log_d, log_l)
    return theta


def _off_range(theta: np.ndarray) -> str | None:
    """Why θ is no law the data identify (an exponent ≤ 0 or past 4, E beyond e^±5), or None."""
    names = ("ln E", "ln A", "ln B", "α", "β")
    for name, value, (low, high) in zip(names, theta, RANGES, strict=True):
        if not low < value < high:
            return f"{name} = {value:.3g}, outside ({low:g}, {high:g})"
    return None


def fit_parametric(n, d, loss, *, bootstrap: int = 200, seed: int = 0) -> Parametric:
    """L(N, D) from the runs, with bootstrap intervals over runs; NotIdentified with fewer than
    8 runs, 3 sizes or 3 token counts, or with a parameter out of its plausible range."""
    n, d, loss = (np.asarray(v, dtype=float) for v in (n, d, loss))
    if len(loss) < MIN_PARAMETRIC_RUNS:
        raise NotIdentified(f"L(N, D) not identified: {len(loss)} runs; it needs 8")
    if len(np.unique(n)) < 3 or len(np.unique(d)) < 3:
        raise NotIdentified("L(N, D) not identified: it needs 3 sizes and 3 token counts")
    log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)
    order = np.argsort(_grid_values(log_n, log_d, log_l))
    theta = _fit_theta(log_n, log_d, log_l, START_GRID[order[:N_STARTS]])
    off = _off_range(theta)
    if off:
        raise NotIdentified(f"L(N, D) not identified: its best fit has {off}")
    # A replicate starts from the fit and from the grid's best start (the whole grid per
    # replicate would cost 16 minimizations each).
    starts = np.vstack([theta, START_GRID[order[:1]]])
    rng = np.random.default_rng(seed)
    replicates, residuals = [], []
    for _ in range(bootstrap):
        rows = _draw(rng, np.arange(len(loss)), n)
        if len(np.unique(d[rows])) < 3:
            continue
        t = _fit_theta(log_n[rows], log_d[rows], log_l[rows], starts)
        replicates.append(t)
        residuals.append(log_l[rows] - np.log(law(t, n[rows], d[rows])))
    if len(replicates) < bootstrap / 2:
        raise NotIdentified(
            f"L(N, D) not identified: only {len(replicates)} of {bootstrap} bootstrap draws "
            "held 3 sizes and 3 token counts"
        )
    values = np.exp(theta[:3]).tolist() + theta[3:].tolist()
    columns = np.array([np.r_[np.exp(t[:3]), t[3:]] for t in replicates]).reshape(-1, 5)
    params = {
        name: _interval(values[i], columns[:, i].tolist(), bootstrap)
        for i, name in enumerate(PARAMETERS)
    }
    own = log_l - np.log(law(theta, n, d))
    return Parametric(theta, params, replicates, residuals, own)
