"""A study's findings and what is written of them: results.csv (one row per run), report.md
(the command, versions, machine, grid, fitted laws with intervals, prediction and check) and
the figures (IsoFLOP curves with their minima, the N_opt(C) frontier with the prediction,
loss against compute per size; skipped with a note without matplotlib)."""

from __future__ import annotations

import csv
import dataclasses
import os
import platform
import sys
from pathlib import Path

import numpy as np

from minigpt_apps.scale import fit
from minigpt_apps.scale.plan import Point, Study
from minigpt_apps.scale.runs import Result

FLOPS_NOTE = (
    "FLOPs per token are `minigpt_jax.flops_per_token` (the README's MFU count): 6 per weight "
    "the matmuls touch plus 12·N·H·K·T for attention. N is those weights: the tied token table "
    "is counted (it is the head's matmul), a learned position table is not (a lookup). "
    "D = steps × batch_size × block_size; a run's C = FLOPs per token × D (steps round down to "
    "whole calls, so C is at most the budget)."
)


@dataclasses.dataclass
class Findings:
    """The fits of a study's ended runs and the prediction (and check) beyond them."""

    results: list[Result]
    frontier: fit.Frontier | None
    parametric: fit.Parametric | None
    notes: list[str]  # why a fit is not identified, failed runs
    predict_budget: float
    factor: float
    n_opt: fit.Interval | None = None
    d_opt: fit.Interval | None = None
    check: Point | None = None
    check_loss: fit.Interval | None = None  # the law's prediction at the check run
    measured: Result | None = None  # the check run, when trained

    def verdict(self) -> str | None:
        if self.measured is None:
            return None
        if self.measured.status != "ok":
            return f"the check run {self.measured.status}: {self.measured.error}"
        if self.check_loss is None:
            return f"measured {self.measured.loss:.4f}; no prediction (L(N, D) not identified)"
        inside = self.check_loss.holds(self.measured.loss)
        return f"measured {self.measured.loss:.4f}, predicted {self.check_loss.text('.4f')}: " + (
            "inside the interval" if inside else "OUTSIDE the interval"
        )


def analyse(
    study: Study, results: list[Result], factor: float, bootstrap: int, seed: int = 0
) -> Findings:
    """Fits the runs that ended ok; predicts N_opt, D_opt at factor × the largest budget."""
    ok = [r for r in results if r.status == "ok"]
    notes = [f"{r.point.name}: {r.status} ({r.error})" for r in results if r.status != "ok"]
    budgets = np.array([r.point.budget for r in ok])
    n = np.array([r.point.params for r in ok], dtype=float)
    d = np.array([r.point.tokens for r in ok], dtype=float)
    loss = np.array([r.loss for r in ok], dtype=float)
    frontier, why = fit.fit_frontier(budgets, n, d, loss, bootstrap=bootstrap, seed=seed)
    notes += why
    parametric = None
    try:
        parametric = fit.fit_parametric(n, d, loss, bootstrap=bootstrap, seed=seed)
    except fit.NotIdentified as error:
        notes.append(str(error))
    target = factor * max(study.budgets)
    findings = Findings(results, frontier, parametric, notes, target, factor)
    if frontier is not None:
        findings.n_opt, findings.d_opt = frontier.n_opt(target), frontier.d_opt(target)
    return findings


# ----------------------------------------------------------------------------- results.csv

COLUMNS = ("run", "budget", "n_layer", "n_embd", "n_head", "params", "tokens", "steps")
COLUMNS += ("flops", "status", "final_val_loss", "check")


def write_csv(path: Path, findings: Findings) -> None:
    rows = [(r, 0) for r in findings.results]
    if findings.measured is not None:
        rows.append((findings.measured, 1))
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(COLUMNS)
        for r, is_check in rows:
            p = r.point
            writer.writerow(
                [p.name, f"{p.budget:.6g}", p.shape.n_layer, p.shape.n_embd, p.shape.n_head]
                + [p.params, p.tokens, p.num_steps, f"{p.flops:.6g}", r.status]
                + ["" if r.loss is None else f"{r.loss:.6f}", is_check]
            )


# ----------------------------------------------------------------------------- report.md


def _versions() -> str:
    import jax
    import scipy

    import minigpt_jax

    return (
        f"minigpt-jax {minigpt_jax.__version__}, jax {jax.__version__}, numpy {np.__version__}, "
        f"scipy {scipy.__version__}, Python {sys.version.split()[0]}"
    )


def _machine() -> str:
    import jax

    return (
        f"{platform.platform()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, JAX backend {jax.default_backend()} "
        f"({', '.join(sorted({d.device_kind for d in jax.devices()}))})"
    )


def markdown(study: Study, findings: Findings, command: list[str]) -> str:
    lines = ["# Scaling study", "", f"Command: `{' '.join(command)}`", ""]
    lines += [f"Versions: {_versions()}.", "", f"Machine: {_machine()}.", ""]
    lines += ["## Grid", "", FLOPS_NOTE, ""]
    lines += [
        f"Base config {study.config_spec}, {study.tokens_per_step} tokens a step, schedule "
        f"{study.schedule} over each run's own steps (warmup {study.warmup_fraction:g} of them), "
        f"vocabulary {study.vocab_size}.",
        "",
        "| run | budget C | shape | N | D | steps | FLOPs | status | final val loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in findings.results:
        p = r.point
        loss = "" if r.loss is None else f"{r.loss:.4f}"
        lines.append(
            f"| {p.name} | {p.budget:.3g} | {p.shape.name} ({p.shape.n_head} heads) | "
            f"{p.params:,} | {p.tokens:,} | {p.num_steps} | {p.flops:.3g} | {r.status} | {loss} |"
        )
    if study.dropped:
        lines += ["", "Left out of the grid: " + "; ".join(study.dropped) + "."]
    level = f"{fit.LEVEL:.0%}"
    lines += ["", "## Fits", "", f"Intervals: {level} percentile bootstrap over runs.", ""]
    if findings.frontier is not None:
        f = findings.frontier
        lines += ["IsoFLOP minima (a parabola in ln N per budget):", ""]
        for v in f.vertices:
            lines.append(
                f"- C = {v.budget:.3g}: N_opt = {np.exp(v.log_n_opt):,.0f}, D_opt = "
                f"{np.exp(v.log_d_opt):,.0f}, loss {v.loss_opt:.4f}"
            )
        lines += [
            "",
            f"N_opt(C) ∝ C^a with a = {f.a.text()}; D_opt(C) ∝ C^b with b = {f.b.text()} "
            f"({f.a.replicates} of {f.a.requested} bootstrap draws had a minimum in every "
            "budget).",
        ]
    if findings.parametric is not None:
        p = findings.parametric
        shown = ", ".join(f"{k} = {v.text()}" for k, v in p.params.items())
        rms = float(np.sqrt(np.mean(p.own_residuals**2)))
        lines += [
            "",
            f"L(N, D) = E + A/N^α + B/D^β (Huber δ = {fit.HUBER_DELTA:g} on log residuals, "
            f"BFGS from the best {fit.N_STARTS} of {len(fit.START_GRID):,} grid starts): {shown}; "
            f"rms log residual {rms:.4f}; {p.params['E'].replicates} bootstrap fits.",
            "",
            f"Its own frontier (C = 6ND): N_opt ∝ C^(β/(α+β)), a = {p.exponent().text()}. The "
            "IsoFLOP a's interval holds the runs' scatter, not the parabola's misfit where the "
            "curves are not symmetric in ln N; where the two a's disagree, suspect that misfit.",
        ]
    if findings.notes:
        lines += ["", "Not identified or left out:", ""] + [f"- {n}" for n in findings.notes]
    lines += ["", "## Prediction", ""]
    c = findings.predict_budget
    if findings.n_opt is None:
        lines.append(f"At C = {c:.3g} ({findings.factor:g}× the largest budget): not identified.")
    else:
        lines.append(
            f"At C = {c:.3g} ({findings.factor:g}× the largest budget), from the IsoFLOP "
            f"frontier: N_opt = {findings.n_opt.text()}, D_opt = {findings.d_opt.text()}."
        )
    if findings.check is not None:
        q = findings.check
        lines.append(
            f"The nearest shape (the ladder's or the grid's): {q.shape.name} (N = {q.params:,}), "
            f"{q.tokens:,} tokens in {q.num_steps} steps ({q.flops:.3g} FLOPs)."
        )
    if findings.check_loss is not None:
        lines.append(
            f"L(N, D) predicts its final val loss {findings.check_loss.text('.4f')} (a "
            "predictive interval: each bootstrap law plus one of its own residuals)."
        )
    verdict = findings.verdict()
    if verdict:
        lines += ["", f"Check: {verdict}."]
    elif findings.check is not None:
        lines += ["", "Check: not trained (rerun with --check)."]
    lines += ["", "Figures: isoflop.png, frontier.png, loss_vs_compute.png.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- figures


def _ndl(r: Result) -> tuple[float, float, float]:
    return r.point.params, r.point.tokens, r.loss


def write_figures(out: Path, findings: Findings) -> list[str]:
    """The three figures; returns notes for those skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return ["figures skipped: matplotlib is not installed (pip install matplotlib)"]
    ok = [r for r in findings.results if r.status == "ok"]
    budgets = sorted({r.point.budget for r in ok})
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(budgets), 1)))
    vertices = {}  # each budget's own parabola, drawn whether or not the frontier is identified
    for c in budgets:
        rs = [r for r in ok if r.point.budget == c]
        try:
            vertices[c] = fit.vertex(
                c, *(np.array(v, dtype=float) for v in zip(*[_ndl(r) for r in rs], strict=True))
            )
        except fit.NotIdentified:
            pass

    fig, ax = plt.subplots(figsize=(6, 4))
    for color, c in zip(colors, budgets, strict=True):
        rs = sorted((r for r in ok if r.point.budget == c), key=lambda r: r.point.params)
        n = np.array([r.point.params for r in rs], dtype=float)
        ax.plot(n, [r.loss for r in rs], "o", color=color, label=f"C = {c:.2g}")
        if c in vertices:
            v = vertices[c]
            x = np.linspace(np.log(n.min()), np.log(n.max()), 50)
            ax.plot(np.exp(x), np.polyval(v.coeffs, x), "-", color=color)
            ax.plot(np.exp(v.log_n_opt), v.loss_opt, "*", color=color, markersize=12)
    ax.set(xscale="log", xlabel="parameters N", ylabel="final val loss", title="IsoFLOP curves")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "isoflop.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    if findings.frontier is not None:
        f = findings.frontier
        c_v = np.array([v.budget for v in f.vertices])
        ax.plot(c_v, np.exp([v.log_n_opt for v in f.vertices]), "o", label="IsoFLOP minima")
        grid = np.geomspace(c_v.min(), findings.predict_budget, 40)
        ax.plot(grid, np.exp(f.log_n0 + f.a.value * np.log(grid)), "-", label=f"a = {f.a.text()}")
        band = [f.n_opt(c) for c in grid]
        ax.fill_between(grid, [b.low for b in band], [b.high for b in band], alpha=0.2)
        p = findings.n_opt
        err = [[p.value - p.low], [p.high - p.value]]
        ax.errorbar([findings.predict_budget], [p.value], yerr=err, fmt="s", color="C3",
                    label=f"prediction at {findings.factor:g}×")  # fmt: skip
        if findings.check is not None:
            ax.plot([findings.check.flops], [findings.check.params], "x", color="k",
                    label=f"check run {findings.check.shape.name}")  # fmt: skip
    else:
        ax.text(0.5, 0.5, "N_opt(C) not identified", ha="center", transform=ax.transAxes)
    ax.set(xscale="log", yscale="log", xlabel="compute C (FLOPs)", ylabel="N_opt")
    # Within one decade matplotlib labels the minor ticks too, and they overlap.
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title("compute-optimal size")
    if findings.frontier is not None:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "frontier.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for shape in sorted({r.point.shape for r in ok}, key=lambda s: (s.n_layer, s.n_embd)):
        rs = sorted((r for r in ok if r.point.shape == shape), key=lambda r: r.point.flops)
        ax.plot([r.point.flops for r in rs], [r.loss for r in rs], "o-", label=shape.name)
    m = findings.measured
    if m is not None and m.status == "ok":
        ax.plot([m.point.flops], [m.loss], "k*", markersize=12, label="check (measured)")
        q = findings.check_loss
        if q is not None:
            err = [[q.value - q.low], [q.high - q.value]]
            ax.errorbar([m.point.flops], [q.value], yerr=err, fmt="s", color="C3",
                        label="check (predicted)")  # fmt: skip
    ax.set(xscale="log", xlabel="compute C (FLOPs)", ylabel="final val loss")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title("loss against compute, per size")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "loss_vs_compute.png", dpi=120)
    plt.close(fig)
    return []
