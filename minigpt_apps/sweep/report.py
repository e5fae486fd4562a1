"""What a researcher reads of a study, written into the sweep folder: trials.csv (Optuna's
trials_dataframe), best_config.py (a config file `minigpt-jax train --config` runs as it is)
and plots/*.png (optuna.visualization.matplotlib), each plot skipped with a note when the study
has too few trials for it."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from minigpt_apps.sweep.space import config_file_text


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_text(text)
    os.replace(tmp, path)  # two commands on one study may write at once: never a torn file


def write_table(study: optuna.Study, out: Path) -> Path:
    path = out / "trials.csv"
    _atomic_write(path, study.trials_dataframe().to_csv(index=False))
    return path


def write_best_config(study: optuna.Study, out: Path, config_spec: str, fixed: dict) -> Path | None:
    """best_config.py of the best complete trial (None when no trial completed)."""
    if not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        return None
    best = study.best_trial
    objective = study.user_attrs.get("objective", "best val loss")
    doc = (
        f"The best trial of study {study.study_name!r} (minigpt-jax sweep): trial {best.number}, "
        f"{objective} {best.value:.6g}.\n\nRun: minigpt-jax train --config {out / 'best_config.py'}"
        f" --workdir runs/best\nIts run: {best.user_attrs.get('run_dir', '?')}\n"
    )
    path = out / "best_config.py"
    _atomic_write(path, config_file_text(config_spec, {**fixed, **best.params}, doc))
    return path


def write_plots(study: optuna.Study, out: Path) -> tuple[list[Path], list[str]]:
    """(the PNGs written, a note for each plot skipped and why)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    params = sorted({name for t in complete for name in t.params})
    reported = [t for t in trials if t.intermediate_values]
    plots = {
        "history": (vis.plot_optimization_history, len(complete) >= 1, "no complete trial"),
        "intermediate_values": (
            vis.plot_intermediate_values,
            len(reported) >= 1,
            "no trial reported a val loss",
        ),
        "slices": (vis.plot_slice, len(complete) >= 1, "no complete trial"),
        "importances": (
            vis.plot_param_importances,
            len(params) >= 2 and len(complete) >= 4,
            f"needs 2 searched keys and 4 complete trials ({len(params)}, {len(complete)})",
        ),
        "contours": (
            vis.plot_contour,
            len(params) >= 2 and len(complete) >= 3,
            f"needs 2 searched keys and 3 complete trials ({len(params)}, {len(complete)})",
        ),
    }
    folder = out / "plots"
    folder.mkdir(exist_ok=True)
    written, skipped = [], []
    for name, (plot, enough, why) in plots.items():
        if not enough:
            skipped.append(f"{name}: {why}")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # optuna's "experimental" warnings
                result = plot(study)
            figure = (result.flat[0] if hasattr(result, "flat") else result).get_figure()
            legends = [axes.get_legend() for axes in figure.axes if axes.get_legend()]
            entries = max((len(legend.get_texts()) for legend in legends), default=0)
            # tall enough for a legend of one line per trial (0.22 in each) to show whole
            figure.set_size_inches(
                max(6.0, figure.get_size_inches()[0]), max(4.5, 0.22 * entries + 1.0)
            )
            with warnings.catch_warnings():  # the contour's colorbar axes: laid out as they are
                warnings.filterwarnings("ignore", "This figure includes Axes", UserWarning)
                figure.tight_layout()
            path = folder / f"{name}.png"
            tmp = folder / f".{name}.{os.getpid()}.png"
            figure.savefig(tmp, dpi=100)
            os.replace(tmp, path)  # another command on the study may write it at once
            plt.close("all")
            written.append(path)
        except (ValueError, RuntimeError, ZeroDivisionError, IndexError) as error:
            plt.close("all")
            skipped.append(f"{name}: {type(error).__name__}: {str(error).splitlines()[0]}")
    return written, skipped
