"""A sweep's worker: it claims trials from the study until it has --trials (or --timeout passes,
or a signal comes), trains each in its run directory through `minigpt-jax train` in a child
(sweep.trial), reports every evaluation to the pruner and records how the trial ended."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from typing import Any

from minigpt_apps.sweep.study import (
    Sweep,
    ask_lock,
    claim,
    make_pruner,
    make_sampler,
    resume_failed,
)

HOLD_ENV = "MINIGPT_JAX_SWEEP_HOLD_BEFORE_RECORD"  # tests: seconds between a trial's end and tell


class WorkerStop:
    """SIGINT/SIGTERM to a worker: stop its trial (it saves a checkpoint) and end."""

    def __init__(self):
        self.signal_name: str | None = None
        self.children: list[subprocess.Popen] = []  # spawned workers, told in turn

    @property
    def exit_status(self) -> int:
        """128 + the signal, as a shell reports it (130 SIGINT, 143 SIGTERM)."""
        return 128 + int(signal.Signals[self.signal_name])

    def __call__(self, sig, frame) -> None:
        self.signal_name = signal.Signals(sig).name
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)


def work(sweep: Sweep, stop: WorkerStop, storage) -> None:
    """Runs trials until the study has --trials, --timeout passes or a signal comes."""
    import optuna

    existing = len(optuna.load_study(study_name=sweep.args.study, storage=storage).trials)
    study = optuna.load_study(
        study_name=sweep.args.study,
        storage=storage,
        sampler=make_sampler(sweep, existing),
        pruner=make_pruner(sweep),
    )
    started = time.monotonic()
    while stop.signal_name is None:
        if sweep.args.timeout and time.monotonic() - started > sweep.args.timeout:
            break
        with ask_lock(sweep.out):
            optuna.storages.fail_stale_trials(study)
            trial, others = claim(study, sweep)
        if trial is None:
            if not others:
                break
            time.sleep(sweep.args.heartbeat)  # another worker's trial: done, or stale soon
            continue
        run_trial(study, trial, sweep, stop)


def _say(sweep: Sweep, text: str) -> None:
    print(f"[worker {sweep.args.worker_index}] {text}", flush=True)


def _prune_reason(study, trial, step: int, value: float, pruner: str) -> str:
    from optuna.trial import TrialState

    if pruner == "median":
        others = [
            t.intermediate_values[step]
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if step in t.intermediate_values
        ]
        if others:  # Optuna compares the trial's best so far with the others' at this step
            reported = study._storage.get_trial(trial._trial_id).intermediate_values
            best = min(v for s, v in reported.items() if s <= step)
            return (
                f"val loss {value:.4f} at step {step} (its best so far {best:.4f}) is above "
                f"the median {statistics.median(others):.4f} of {len(others)} complete "
                "trials there (median pruner)"
            )
    words = {"halving": "successive halving", "hyperband": "Hyperband", "median": "median"}
    return f"val loss {value:.4f} at step {step} is not among the best there ({words[pruner]})"


def run_trial(study, trial, sweep: Sweep, stop: WorkerStop) -> None:
    """Trains one trial in its run directory and records its end: complete (its objective),
    pruned (where and why), failed (the child's error), or queued to resume (stopped)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    from minigpt_apps.sweep import space as spaces
    from minigpt_apps.sweep import trial as trials
    from minigpt_jax.config_dict import check_experiment_config

    storage, number = study._storage, trial.number
    # relative to OUT: the study's folder's trials/NNNN (a queued resume: its run's)
    run_rel = trial.user_attrs.get("run_dir") or str(
        (sweep.folder / "trials" / f"{number:04d}").relative_to(sweep.out)
    )
    trial.set_user_attr("run_dir", run_rel)
    run_dir = sweep.out / run_rel
    run_dir.mkdir(parents=True, exist_ok=True)
    values = {**sweep.fixed, **trial.params}
    shown = ", ".join(f"{k}={v!r}" for k, v in trial.params.items())
    resumes = trial.user_attrs.get("resumes")
    again = "" if resumes is None else f" (resumes trial {resumes})"
    _say(sweep, f"trial {number}: {shown}{again}")
    config_file = run_dir / "config.py"
    doc = f"Trial {number} of study {sweep.args.study!r} (minigpt-jax sweep): {shown}."
    config_file.write_text(spaces.config_file_text(sweep.args.config, values, doc))

    def fail(reason: str) -> None:
        trial.set_user_attr("error", reason)
        study.tell(trial, state=TrialState.FAIL)
        _say(sweep, f"trial {number}: failed: {reason}")

    try:
        config = check_experiment_config(spaces.config_with(sweep.args.config, values))
    except ValueError as error:
        return fail(f"config refused: {error}")
    tokens_per_step = config.batch_size * config.model.block_size
    target = sweep.args.target
    beat = {"at": time.monotonic(), "mine": True}
    pruned: dict[str, Any] = {}

    def on_evaluation(step: int, val_loss: float) -> str | None:
        trial.report(val_loss, step)
        if target is not None and val_loss <= target:
            return "reached"
        if trial.should_prune():
            pruned.update(
                step=step, reason=_prune_reason(study, trial, step, val_loss, sweep.args.pruner)
            )
            return "pruned"
        return None

    def keep_going() -> bool:
        if time.monotonic() - beat["at"] >= sweep.args.heartbeat:
            beat["at"] = time.monotonic()
            storage.record_heartbeat(trial._trial_id)
            beat["mine"] = storage.get_trial(trial._trial_id).state == TrialState.RUNNING
        return stop.signal_name is None and beat["mine"]

    if resumes is not None:
        trials.wait_for_run_lock(run_dir)  # the killed worker's child may still be saving
    env = trials.child_env(sweep.args.worker_index, sweep.args.gpus_per_worker, sweep.args.workers)
    child = trials.start(run_dir, config_file, env)
    code, why = trials.follow(child, run_dir, on_evaluation, keep_going)
    if os.environ.get(HOLD_ENV):
        time.sleep(float(os.environ[HOLD_ENV]))  # tests: a kill -9 between the end and tell
    if not beat["mine"]:
        return _say(sweep, f"trial {number}: taken over (its heartbeat lapsed); left to it")
    try:
        if why == "pruned":
            last = max((r["step"] for r in trials.records_of(run_dir)), default=pruned["step"])
            trial.set_user_attr("pruned_at_step", pruned["step"])
            trial.set_user_attr("stopped_at_step", last)  # a few steps on: the worker's reaction
            trial.set_user_attr("pruned_reason", pruned["reason"])
            study.tell(trial, state=TrialState.PRUNED)
            return _say(
                sweep, f"trial {number}: pruned at step {pruned['step']}: {pruned['reason']}"
            )
        result = trials.result_of(run_dir, tokens_per_step, target)
        reached = why == "reached" or result.step_at_target is not None
        if why == "stopped" or (code == 0 and not reached and result.last_step < config.num_steps):
            # Stopped before its end (a signal): queued to resume from its checkpoint.
            trial.set_user_attr("stopped_at_step", result.last_step)
            study.tell(trial, state=TrialState.FAIL)
            resume_failed(study, storage.get_trial(trial._trial_id))
            where = (
                f"at step {result.last_step}, checkpoint kept"
                if result.last_step
                else "before its first step"  # a signal while the child started
            )
            return _say(
                sweep, f"trial {number}: stopped {where}; rerun the same command to resume it"
            )
        if code != 0 or result.best_val_loss is None:
            return fail(trials.last_line(run_dir) if code else "the run recorded no val loss")
        trial.set_user_attr("best_val_loss", result.best_val_loss)
        trial.set_user_attr("last_step", result.last_step)
        trial.set_user_attr("train_seconds", result.train_seconds)
        if target is None:
            value = result.best_val_loss
            words = f"best val loss {value:.4f}"
        elif reached:
            value = result.seconds_to_target
            trial.set_user_attr("step_at_target", result.step_at_target)
            words = f"val loss {target} at step {result.step_at_target}, {value:.2f} s of training"
        else:
            value = 2 * result.train_seconds
            trial.set_user_attr("missed_target", True)
            words = f"missed {target} (best {result.best_val_loss:.4f}): scores {value:.2f} s"
        study.tell(trial, value)
        _say(sweep, f"trial {number}: {words}")
    except UpdateFinishedTrialError:
        _say(sweep, f"trial {number}: another worker recorded it first (heartbeat lapsed)")
