"""The training loop: `Trainer` (restore or init, compiled steps, evaluation, checkpoints),
`RunLogger` (metrics, progress) and `train_and_evaluate`, which drives them chunk by chunk."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import shutil
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from minigpt_jax import budget, sharding
from minigpt_jax.data import dataset as data
from minigpt_jax.data.storage import dataset_from
from minigpt_jax.experiment import check_experiment_config, gpt_config_from
from minigpt_jax.loading import check_fits, load_model, params_for
from minigpt_jax.model.attention_fns import choose_kernel
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.eval_metrics import metric_name, parse_metrics
from minigpt_jax.model.losses import parse_terms, term_name
from minigpt_jax.runtime.locks import RunLock
from minigpt_jax.runtime.run_dir import RunDir
from minigpt_jax.runtime.signals import StopRequest
from minigpt_jax.settings.registry import user_module_digests, user_modules
from minigpt_jax.train.checkpoint import Checkpointer
from minigpt_jax.train.metrics import MetricsWriter
from minigpt_jax.train.optimizers import build_optimizer
from minigpt_jax.train.resume import check_resume, check_resume_data, check_resume_plugins
from minigpt_jax.train.step import (
    TrainState,
    check_metrics,
    evaluate,
    init_state,
    make_eval_step,
    make_init_state,
    make_metric_step,
    make_train_chunk,
    state_shardings,
)

Array = chex.Array
_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- loop


class StopBeforeTraining(BaseException):
    """SIGINT/SIGTERM arrived while a run was still being set up (reading its data, restoring,
    compiling): a BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""

    def __init__(self, signal_name: str, phase: str):
        super().__init__(signal_name, phase)
        self.signal_name, self.phase = signal_name, phase


class _StopRequest(StopRequest):
    """Turns SIGINT/SIGTERM into a flag the loop checks between compiled calls (and between
    evaluation batches); while `phase` names a setup step, the signal raises
    StopBeforeTraining at once instead (nothing is trained yet, so nothing needs saving)."""

    def __init__(self):
        super().__init__()
        self.phase: str | None = None  # set by setup_phase until the loop starts
        self.step: int | None = 0  # where a run stopped during its setup stands (None: unknown)

    def raises_on(self, sig: signal.Signals) -> bool:
        return self.phase is not None

    def on_signal(self, sig: signal.Signals) -> None:
        super().on_signal(sig)
        if self.phase is not None:
            raise StopBeforeTraining(self.signal_name, self.phase)

    def setup_phase(self, phase: str, step: int | None) -> None:
        """Notes the setup step a run has reached and the training step it stands at (None
        while the checkpoints are still being checked; a signal that came before the first
        step is answered now)."""
        self.phase, self.step = phase, step
        if self.signal_name is not None:
            raise StopBeforeTraining(self.signal_name, phase)


@dataclasses.dataclass
class RunSummary:
    """What a run reports when it ends (returned by `train_and_evaluate`)."""

    step: int
    train_loss: float | None
    val_loss: float | None
    eval_train_loss: float | None
    best_val_loss: float | None
    wall_time_s: float
    compile_time_s: float
    median_step_ms: float | None
    resumed_from: int | None
    interrupted_by: str | None
    before_training: bool = False  # stopped during the setup: its one line says all of it


class Trainer:
    """One run's model, data and state: restore-or-init, compiled steps, evaluation that keeps the
    best params, checkpoints. `train_and_evaluate` drives it chunk by chunk."""

    def __init__(
        self,
        config: Any,
        workdir: Path,
        *,
        progress: bool = False,
        allow_resume_changes: bool = False,
        before_writing: Callable[[], None] = lambda: None,
        on_phase: Callable[[str, int | None], None] = lambda phase, step: None,
        last_step: int | None = None,
    ):
        """config: a complete, checked run config (`run_config.check_experiment_config`).

        Every check that can refuse the config runs before anything is written: the data is
        checked before it is cached, a resumed run's settings before its data changes, its
        token stream against the checkpoint's before a data file is rewritten, and
        before_writing() (taking the run lock) is called before the first write.
        on_phase(what, step) names each setup step as it starts ("reading the data", ...) and
        the step the run stands at (None until the checkpoints are checked). A run already at
        last_step compiles no train step (it has nothing to train).
        """
        self.config, self.workdir = config, workdir
        self.allow_resume_changes = allow_resume_changes
        self._before_writing, self._on_phase = before_writing, on_phase
        self.checkpointer = Checkpointer(
            workdir, config.keep_checkpoints, write_digests=jax.process_index() == 0
        )
        try:
            self._load_data_and_model(progress)
            self._before_writing()
            self.checkpointer.start_writing()
            self.state, self.resumed_from, self.best_val = self._restore_or_init()
            self._eval_fn = make_eval_step(self.cfg, self.mesh, self.shardings.params, self.terms)
            self._metric_fn = None
            if self.metrics:
                self._metric_fn = make_metric_step(
                    self.cfg, self.metrics, self.mesh, self.shardings.params
                )
            self.compile_time_s = 0.0
            if last_step is None or self.step < last_step:
                self._on_phase("compiling", self.step)
                self._compile()
        except BaseException:
            self.checkpointer.close()  # an open orbax manager prints tracebacks at exit
            raise

    def _load_data_and_model(self, progress: bool) -> None:
        """The dataset, the model config, the optimizer, the loss terms and the mesh."""
        config = self.config
        # The checkpoints first: every later phase then names the step the run stands at.
        self._on_phase("checking the checkpoints", None)
        latest = self.checkpointer.latest_step()
        at = latest or 0
        # A pretrained model brings its tokenizer and vocabulary (config.data's are then unused).
        self._on_phase("reading config.init_from", at)
        self.pretrained = load_model(config.init_from) if config.init_from else None
        self.optimizer = build_optimizer(config.optim, config.num_steps)
        self.tx, self.schedule = self.optimizer.tx, self.optimizer.schedule
        self.terms = parse_terms(config.loss.terms)
        self.metrics = self._checked_metrics()
        self.mesh = sharding.make_mesh(config.mesh)
        # batch_size is per optimizer step; each micro-batch splits over the devices on its own.
        self.micro_batch_size = config.batch_size // config.grad_accum_steps
        sharding.check_batch_size(self.micro_batch_size, self.mesh)
        if self.pretrained is not None:
            self._check_memory(self.pretrained.cfg.vocab_size)
        else:  # a char vocabulary is known once the corpus is read: counted as 1 until then
            self._check_memory(config.data.vocab_size if config.data.tokenizer == "bpe" else 1)
        self.data_change: str | None = None  # another token stream than the checkpoint's
        check_data = None
        if latest is not None:
            # The settings first, so a refused resume changes no data file.
            saved = self.checkpointer.read_meta(latest)
            vocab_size = saved.get("gpt_config", {}).get("vocab_size", 1)
            self._check_resume(latest, saved, gpt_config_from(config, vocab_size))
            check_data = functools.partial(self._check_data, latest, saved.get("data"))
        self._on_phase("reading the data", at)
        self.dataset = dataset_from(
            config,
            self.workdir,
            self.pretrained.tokenizer if self.pretrained else None,
            progress=progress,
            before_writing=self._before_writing,
            check_data=check_data,
        )
        vocab_size = (self.pretrained.cfg if self.pretrained else self.dataset.tokenizer).vocab_size
        self.cfg = gpt_config_from(config, vocab_size)
        self._check_memory(vocab_size)
        if self.pretrained is not None and latest is None:
            check_fits(self.pretrained.cfg, self.cfg)
        self.shardings = state_shardings(self.cfg, self.tx, self.mesh)
        # Which params evaluation, best/, sampling and export use, decided by the optimizer.
        self.eval_params_name, select = self.optimizer.eval_params(self.shardings.opt_state)
        self._select_eval_params = None
        if select is not None:
            self._select_eval_params = jax.jit(
                lambda state: select(state.opt_state, state.params),
                out_shardings=self.shardings.params,
            )
        self.meta = {
            "gpt_config": dataclasses.asdict(self.cfg),
            "config": config.to_dict(),
            "data": self.dataset.digest.as_dict(),
            "eval_params": self.eval_params_name,
            "plugins": user_module_digests(config),
        }

    def _checked_metrics(self) -> tuple[str, ...]:
        """config.eval.metrics resolved and probed against their contract (shapes only), before
        anything is written; a name clashing with a loss term's is refused."""
        config = self.config
        metrics = parse_metrics(config.eval.get("metrics", ""))
        taken = {"loss", "cross_entropy", *(term_name(key) for key, _ in self.terms)}
        for key in metrics:
            if metric_name(key) in taken:
                raise ValueError(
                    f"config.eval.metrics: {key!r} is logged as {metric_name(key)!r}, the name "
                    "of a loss value; rename the metric (its attr in module:attr)."
                )
        if metrics:
            vocab_size = self.pretrained.cfg.vocab_size if self.pretrained else 256
            check_metrics(gpt_config_from(config, vocab_size), metrics)
        return metrics

    def _check_memory(self, vocab_size: int) -> None:
        """Refuses, before any array is allocated, a run whose state, batches, logits and
        residual stream alone (budget.train_bytes_lower_bound, from shapes) exceed the
        devices' memory."""
        config = self.config
        cfg = gpt_config_from(config, vocab_size)
        state_shapes = jax.eval_shape(
            functools.partial(init_state, cfg, self.tx), jax.random.key(0)
        )
        fused = choose_kernel(cfg, weight_dropout=cfg.dropout > 0, cached=False) == "cudnn"
        batches = (config.steps_per_call, config.batch_size, config.model.block_size + 1)
        needed = budget.train_bytes_lower_bound(
            cfg, state_shapes, self.micro_batch_size, batches, fused_attention=fused
        )
        budget.check_train_fits(needed, self.mesh)

    def _check_resume(self, latest: int, saved_meta: dict, cfg: GPTConfig) -> list[str]:
        """The accepted trajectory changes of resuming checkpoint `latest`; raises ValueError
        for a refused one (resume.check_resume) or a step past config.num_steps."""
        meta = {"gpt_config": dataclasses.asdict(cfg), "config": self.config.to_dict()}
        changes = check_resume(
            saved_meta,
            meta,
            self.checkpointer.run_dir.checkpoints / str(latest),
            allow_changes=self.allow_resume_changes,
        )
        changes += check_resume_plugins(
            saved_meta.get("plugins"),
            user_module_digests(self.config),
            user_modules(self.config),
            self.checkpointer.run_dir.checkpoints / str(latest),
            allow_changes=self.allow_resume_changes,
        )
        if latest > self.config.num_steps:
            raise ValueError(
                f"{self.checkpointer.run_dir.checkpoints / str(latest)} is past "
                f"num_steps={self.config.num_steps}, so there is nothing to train; raise "
                f"--config.num_steps above {latest} to continue it, or use a fresh --workdir."
            )
        return changes

    def _check_data(self, latest: int, saved: dict | None, digest: data.DataDigest) -> None:
        """Refuses another token stream than checkpoint `latest` trained on (resume.
        check_resume_data), called by the data loading before any data file is rewritten;
        with allow_resume_changes notes the change (best_val_loss then starts afresh)."""
        self.data_change = check_resume_data(
            saved,
            digest.as_dict(),
            self.checkpointer.run_dir.checkpoints / str(latest),
            where=f"data.path={self.config.data.path}"
            if self.config.data.path
            else f"data.corpus={self.config.data.corpus}",
            allow_changes=self.allow_resume_changes,
        )

    def _compile(self) -> None:
        """Compiles the train chunk ahead of the first call and times it."""
        compile_start = time.perf_counter()
        self._train_chunk = (
            make_train_chunk(
                self.cfg,
                self.tx,
                self.schedule,
                self.mesh,
                self.shardings,
                grad_accum_steps=self.config.grad_accum_steps,
                terms=self.terms,
            )
            .lower(self.state, self.batches_from(self.step))
            .compile()
        )
        budget.check_compiled_fits(self._train_chunk, self.mesh)
        self.compile_time_s = time.perf_counter() - compile_start

    @property
    def step(self) -> int:
        return int(self.state.step)

    def _restore_or_init(self) -> tuple[TrainState, int | None, float]:
        """(state, step resumed from or None, best val loss so far): the newest intact
        checkpoint in workdir if there is one, once its saved model and trajectory settings
        are checked against this run's; else a fresh state from config.seed, whose params are
        config.init_from's when set."""
        state = make_init_state(self.cfg, self.tx, self.mesh, self.shardings)(
            jax.random.key(self.config.seed)
        )
        latest = self.checkpointer.latest_step()
        self.pending_evaluation = False
        if latest is None:
            self._on_phase("initializing the model", 0)
            if self.pretrained is not None:
                # AdamW's moments start at zero whatever the params, so only the params change.
                # Host arrays, the same on every process, which device_put places on any mesh.
                params = jax.tree_util.tree_map(np.asarray, params_for(self.pretrained, self.cfg))
                state = state.replace(params=jax.device_put(params, self.shardings.params))
            return state, None, math.inf
        self._on_phase(f"restoring checkpoint {latest}", latest)
        changes = self._check_resume(latest, self.checkpointer.read_meta(latest), self.cfg)
        if changes:
            _log.warning("resuming step %d with changed settings: %s", latest, "; ".join(changes))
        state, saved_meta = self.checkpointer.restore(state, latest)
        # A signal stopped this step's evaluation: it runs first when the run resumes.
        self.pending_evaluation = bool(saved_meta.get("pending_evaluation"))
        best_val = saved_meta.get("best_val_loss") or math.inf
        if self.data_change is not None:
            _log.warning(
                "resuming step %d on other data (%s): the best val loss so far (%.4f) was "
                "measured on a validation split that is gone, so it starts afresh.",
                latest,
                self.data_change,
                best_val,
            )
            best_val = math.inf
        return state, int(state.step), best_val

    def batches_from(self, first_step: int) -> jax.Array:
        """Steps [first_step, first_step + steps_per_call) of every process's identical global
        batches, placed on the mesh."""
        config = self.config
        batches = np.stack(
            [
                data.get_batch(
                    self.dataset.train,
                    config.batch_size,
                    config.model.block_size,
                    seed=config.seed,
                    step=s,
                )
                for s in range(first_step, first_step + config.steps_per_call)
            ]
        )
        return sharding.put_batch(batches, sharding.batch_sharding(self.mesh, 3))

    def batch_problem(self, step: int) -> str | None:
        """What is wrong with the token ids of the batch of training step `step` (1-based),
        read again from the data: an id outside the vocabulary (memory-mapped shards changed
        under the run), or None."""
        batch = data.get_batch(
            self.dataset.train,
            self.config.batch_size,
            self.config.model.block_size,
            seed=self.config.seed,
            step=step - 1,
        )
        largest = int(np.max(batch))
        if largest < self.cfg.vocab_size:
            return None
        if self.config.data.format == "shards":
            where = f"the shards in {self.config.data.shards_dir or self.workdir / 'shards'}"
        else:
            where = "the training data"
        return (
            f"the batch of step {step} holds token id {largest:,}, outside the model's "
            f"vocabulary [0, {self.cfg.vocab_size:,}): {where} changed or were damaged while "
            "the run read them; nothing of this step was saved. Rerun the same command: a run "
            "checks its data at the start (and prepares damaged shards again), then resumes "
            "from its last checkpoint."
        )

    def train_chunk(self, first_step: int) -> dict[str, Array]:
        """Dispatches steps_per_call steps from `first_step`; the metrics (C,) stay on device."""
        self.state, metrics = self._train_chunk(self.state, self.batches_from(first_step))
        return metrics

    def evaluate_and_keep_best(
        self, step: int, should_stop: Callable[[], bool] | None = None
    ) -> tuple[dict[str, float], dict[str, float]] | None:
        """(val, train) results of the eval params on the fixed eval batches, each {"loss": ...,
        term: ..., metric: ...}; saves those params to best/ when the val loss is the lowest
        yet. None, with nothing recorded, when should_stop() turned true between two batches."""
        results = []
        params = self.eval_params()
        for tokens, split in ((self.dataset.val, "val"), (self.dataset.train, "train")):
            result = evaluate(
                self._eval_fn,
                params,
                tokens,
                num_batches=self.config.eval_batches,
                batch_size=self.micro_batch_size,  # what fits in memory
                block_size=self.config.model.block_size,
                seed=self.config.seed,
                split=split,
                mesh=self.mesh,
                should_stop=should_stop,
                metric_fn=self._metric_fn,
            )
            if result is None:
                return None
            results.append(result)
        val, train = results
        val_loss = val["loss"]
        if not math.isfinite(val_loss):
            what = f"val loss {val_loss}"
            raise non_finite_error(what, step, self.checkpointer, self.terms, val)
        if val_loss < self.best_val:
            self._check_params_finite(step, params)
            self.best_val = val_loss
            self.checkpointer.save_best(step, params, {**self.meta, "val_loss": val_loss})
        return val, train

    def eval_params(self) -> Any:
        """The params evaluation, best/, sampling and export use (optim.eval_params): the
        trained ones, or what the optimizer's hook selects from the train state."""
        if self._select_eval_params is None:
            return self.state.params
        return self._select_eval_params(self.state)

    def _check_params_finite(self, step: int, params: Any = None) -> None:
        params = self.state.params if params is None else params
        if not bool(jax.device_get(_all_finite(params))):
            raise non_finite_error("parameters", step, self.checkpointer)

    def save(self, pending_evaluation: bool = False) -> None:
        """Checkpoints the train state; refuses non-finite parameters (never saved as good).
        pending_evaluation: this step's evaluation was stopped; a resumed run does it first."""
        self._check_params_finite(self.step)
        meta = {**self.meta, "best_val_loss": _finite_or_none(self.best_val)}
        if pending_evaluation:
            meta["pending_evaluation"] = True
        # Other eval params than the trained ones are saved beside the state, for sampling.
        eval_params = None if self._select_eval_params is None else self.eval_params()
        if eval_params is not None:
            self._check_params_finite(self.step, eval_params)
        self.checkpointer.save(self.state, meta, eval_params=eval_params)


class RunLogger:
    """Per-chunk bookkeeping: fetches each chunk's metrics (refusing non-finite ones), times the
    chunks, writes metrics.jsonl / TensorBoard rows and drives the progress bar.

    A chunk's metrics are fetched when the next chunk has been dispatched (`dispatched`), so the
    host never waits on the device in between, or at once before an evaluation or checkpoint
    (`drain`). In a multi-host run only process 0 writes and shows the bar.
    """

    def __init__(self, config: Any, workdir: Path, trainer: Trainer, *, progress: bool):
        self.steps_per_call, self.log_every = config.steps_per_call, config.log_every
        self.tokens_per_chunk = config.steps_per_call * config.batch_size * config.model.block_size
        self.checkpointer = trainer.checkpointer  # named in the non-finite-loss error
        self.terms = trainer.terms  # a term's own non-finite value is named as the cause
        self.batch_problem = trainer.batch_problem  # asked when a loss is non-finite
        is_main_process = jax.process_index() == 0
        self.writer = MetricsWriter(workdir, resume_step=trainer.step, enabled=is_main_process)
        self.bar = tqdm(
            total=config.num_steps,
            initial=trainer.step,
            disable=not (progress and is_main_process),
            unit="step",
            dynamic_ncols=True,
        )
        self.chunk_seconds: list[float] = []
        self.train_loss: float | None = None
        self.val_loss: float | None = None
        self.eval_train_loss: float | None = None
        self._pending = None  # (first_step, device metrics, dispatched_at) of the chunk in flight
        self._ready_at = time.perf_counter()  # when the device last finished (or was last idle)

    def dispatched(self, first_step: int, metrics: dict, dispatched_at: float) -> None:
        """Notes the chunk just dispatched; records the one before it, done by now."""
        self.drain()
        self._pending = (first_step, metrics, dispatched_at)

    def drain(self) -> None:
        """Records the chunk in flight, if any (blocks until it is done)."""
        if self._pending is not None:
            self._record(*self._pending)
            self._pending = None

    def _record(self, first_step: int, metrics: dict, dispatched_at: float) -> None:
        metrics = jax.device_get(metrics)
        # The chunk ran from the later of its dispatch and the previous chunk's end until now.
        now = time.perf_counter()
        seconds = now - max(dispatched_at, self._ready_at)
        self._ready_at = now
        self.chunk_seconds.append(seconds)
        tokens_per_sec = self.tokens_per_chunk / seconds
        for i in range(self.steps_per_call):
            step = first_step + i + 1
            loss, grad_norm = float(metrics["loss"][i]), float(metrics["grad_norm"][i])
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                problem = self.batch_problem(step)
                if problem is not None:
                    raise ValueError(problem)
                values = {k: float(v[i]) for k, v in metrics.items()}
                what = f"training loss {loss} (grad norm {grad_norm})"
                raise non_finite_error(what, step, self.checkpointer, self.terms, values)
            # Every metric the step returns (the loss's aux values too), under its own name.
            row = {"train_loss": loss}
            row.update({k: float(v[i]) for k, v in metrics.items() if k != "loss"})
            row["tokens_per_sec"] = tokens_per_sec
            self.writer.write(step, row, tensorboard=step % self.log_every == 0)
            self.train_loss = loss
        self.bar.update(self.steps_per_call)
        if (first_step + self.steps_per_call) % self.log_every < self.steps_per_call:
            self.bar.set_postfix(loss=f"{self.train_loss:.4f}", tok_s=f"{tokens_per_sec:,.0f}")

    def evaluation(self, step: int, val: dict[str, float], train: dict[str, float]) -> None:
        """Records an evaluation: val_loss and eval_train_loss, and val_<term> and
        eval_train_<term> for every other value the evaluation returned."""
        self.val_loss, self.eval_train_loss = val["loss"], train["loss"]
        row = {f"val_{k}": v for k, v in val.items()}
        row.update({f"eval_train_{k}": v for k, v in train.items()})
        self.writer.write(step, row)
        self.bar.write(
            f"step {step}: train loss {self.eval_train_loss:.4f}, val loss {self.val_loss:.4f}"
        )

    def flush(self) -> None:
        """Flushes the files; host-side work (evaluation, checkpoints) is not chunk time."""
        self.writer.flush()
        self._ready_at = time.perf_counter()

    def message(self, text: str) -> None:
        self.bar.write(text)

    def median_step_ms(self) -> float | None:
        if not self.chunk_seconds:
            return None
        return 1000 * statistics.median(self.chunk_seconds) / self.steps_per_call

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


def train_and_evaluate(
    config: Any,
    workdir: str | Path,
    *,
    progress: bool = True,
    stop_at: int | None = None,
    allow_resume_changes: bool = False,
) -> RunSummary:
    """Trains `config` (an experiment ConfigDict) in `workdir`, resuming from its latest checkpoint.

    A fresh run starts from config.init_from when set: a Hugging Face GPT-2 directory or another
    run's workdir, whose tokenizer it takes; config.model must match that model's shape.

    stop_at: end this call after that step (a multiple of steps_per_call) with a checkpoint, as an
    interruption would; the learning-rate schedule still spans config.num_steps.
    allow_resume_changes: resume even though seed, batch_size, data or optim differ from the
    checkpoint's (minigpt_jax.train.resume); the model must always match.

    Writes workdir/{run.lock, tokenizer.json, tokens.npy (data.format "memory") or shards/
    (data.format "shards", unless data.shards_dir is elsewhere), metrics.jsonl, tensorboard/,
    checkpoints/, best/}, only once every config, model and mesh check has passed, and holding
    run.lock, so a second trainer in the same workdir fails at once. SIGINT/SIGTERM save a
    checkpoint and return; a non-finite loss, val loss or parameter raises FloatingPointError
    and leaves the last good checkpoint in place (nothing non-finite is ever saved).
    """
    wall_start = time.perf_counter()
    config = check_experiment_config(config)  # complete: every setting, defaults filled in
    micro_batch_size = config.batch_size // config.grad_accum_steps
    sharding.check_batch_size(micro_batch_size, sharding.make_mesh(config.mesh))
    chunk = config.steps_per_call
    if stop_at is not None and (stop_at < 1 or stop_at % chunk):
        raise ValueError(
            f"stop_at={stop_at} must be a positive multiple of steps_per_call={chunk}."
        )
    last_step = config.num_steps if stop_at is None else min(stop_at, config.num_steps)
    _warn_if_all_warmup(config)
    workdir = Path(workdir)
    stop = _StopRequest()
    # Nothing is created until every check has passed (RunLock.create, called by the Trainer).
    lock = RunLock(workdir, jax.process_index(), create=False)
    before = _fresh_workdir_entries(workdir)
    with stop, lock:
        trainer = log = None
        try:
            trainer = Trainer(
                config,
                workdir,
                progress=progress,
                allow_resume_changes=allow_resume_changes,
                before_writing=lock.create,
                on_phase=stop.setup_phase,
                last_step=last_step,
            )
            log = RunLogger(config, workdir, trainer, progress=progress)
            stop.phase = None  # from here on a signal is a request the loop answers
        except StopBeforeTraining as stopped:
            if trainer is not None:
                trainer.checkpointer.close()
            return _stopped_before_training(stopped, stop.step, wall_start)
        except Exception:
            # A fresh run whose setup failed (e.g. a plug-in failing when the step is traced)
            # leaves its workdir as it was: what it created goes, run.lock (released) too.
            if before is not None and jax.process_index() == 0:
                lock.__exit__(None, None, None)
                _remove_created(workdir, before)
            raise
        try:
            if trainer.pending_evaluation:
                if _evaluate(trainer, log, trainer.step, stop):
                    trainer.save()  # the same step, its evaluation done
                    log.flush()
                else:
                    log.message(
                        f"{stop.signal_name} received during the step-{trainer.step} "
                        "evaluation: stopped; its checkpoint is unchanged; rerun the same "
                        "command to resume."
                    )
            if trainer.step >= last_step and not stop.requested():
                log.message(
                    f"step {trainer.step} is already trained (num_steps={config.num_steps}); "
                    "raise --config.num_steps to train further."
                )
            for first_step in range(trainer.step, last_step, chunk):
                if stop.requested():
                    break
                dispatched_at = time.perf_counter()
                log.dispatched(first_step, trainer.train_chunk(first_step), dispatched_at)
                end = first_step + chunk
                evaluate_now = end % config.eval_every == 0 or end == config.num_steps
                if not (evaluate_now or end % config.checkpoint_every == 0 or end == last_step):
                    if not stop.requested():
                        continue
                log.drain()
                evaluated = _evaluate(trainer, log, end, stop) if evaluate_now else True
                # Decided after the evaluation: a signal during it is answered by this save.
                if end % config.checkpoint_every == 0 or end == last_step or stop.requested():
                    trainer.save(pending_evaluation=not evaluated)
                    log.flush()
                    if stop.requested():
                        log.message(
                            f"{stop.signal_name} received: checkpoint saved at step {end}"
                            + ("" if evaluated else " (its evaluation was stopped; it runs first")
                            + ("" if evaluated else " when the run resumes)")
                            + "; rerun the same command to resume."
                        )
                        break
                log.flush()
        finally:
            log.close()
            trainer.checkpointer.close()

    return RunSummary(
        step=trainer.step,
        train_loss=log.train_loss,
        val_loss=log.val_loss,
        eval_train_loss=log.eval_train_loss,
        best_val_loss=_finite_or_none(trainer.best_val),
        wall_time_s=time.perf_counter() - wall_start,
        compile_time_s=trainer.compile_time_s,
        median_step_ms=log.median_step_ms(),
        resumed_from=trainer.resumed_from,
        interrupted_by=stop.signal_name,
    )


def _fresh_workdir_entries(workdir: Path) -> set[str] | None:
    """The names in a workdir that holds no run yet (no checkpoints; an empty set if it does
    not exist), for `_remove_created`; None for a workdir with a run in it (never cleaned)."""
    if not workdir.exists():
        return set()
    if RunDir(workdir).has_checkpoints():
        return None
    return {p.name for p in workdir.iterdir()} | {"."}  # "." : the workdir existed


def _remove_created(workdir: Path, before: set[str]) -> None:
    """Removes what a failed setup created in `workdir` (the workdir too if it created it)."""
    if not workdir.exists():
        return
    created = (
        [workdir]
        if "." not in before
        else [path for path in workdir.iterdir() if path.name not in before]
    )
    for path in created:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _evaluate(trainer: Trainer, log: RunLogger, step: int, stop: _StopRequest) -> bool:
    """Evaluates at `step` and records it; False if a signal stopped it between batches."""
    results = trainer.evaluate_and_keep_best(step, should_stop=stop.requested)
    if results is None:
        return False
    log.evaluation(step, *results)
    return True


def _stopped_before_training(
    stopped: StopBeforeTraining, step: int | None, wall_start: float
) -> RunSummary:
    """The summary (and the one line saying so) of a run stopped during its setup; step: the
    one it stands at, None if the checkpoints were not checked yet."""
    print(
        f"{stopped.signal_name} received while {stopped.phase}, before training"
        + ("" if step is None else f" step {step + 1}")
        + ": nothing new to save"
        + (f" (checkpoint {step} is unchanged)" if step else "")
        + "; rerun the same command to resume.",
        flush=True,
    )
    return RunSummary(
        step=step or 0,
        train_loss=None,
        val_loss=None,
        eval_train_loss=None,
        best_val_loss=None,
        wall_time_s=time.perf_counter() - wall_start,
        compile_time_s=0.0,
        median_step_ms=None,
        resumed_from=step or None,
        interrupted_by=stopped.signal_name,
        before_training=True,
    )


def _warn_if_all_warmup(config: Any) -> None:
    """Warns of a learning rate that never leaves its warmup within num_steps."""
    warmup, steps = config.optim.warmup_steps, config.num_steps
    if warmup > steps:
        _log.warning(
            "optim.warmup_steps=%d is above num_steps=%d: the learning rate never leaves its "
            "warmup and peaks at %.2g%% of optim.lr; lower optim.warmup_steps (e.g. to %d) or "
            "raise num_steps.",
            warmup,
            steps,
            100 * steps / warmup,
            max(steps // 10, 1),
        )


@jax.jit
def _all_finite(tree: Any) -> Array:
    return jnp.all(jnp.stack([jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)]))


def non_finite_error(
    what: str,
    step: int,
    checkpointer: Checkpointer,
    terms: tuple[tuple[str, float], ...] = (),
    values: dict[str, float] | None = None,
) -> FloatingPointError:
    """The error for a non-finite `what` at `step`, naming the newest checkpoint: the last good
    one, since nothing non-finite is ever saved. A loss term whose own value (`values`, the
    step's aux values by name) is non-finite is named as the cause instead of the lr."""
    good = checkpointer.latest_step()
    for key, _ in terms:
        value = (values or {}).get(term_name(key))
        if value is not None and not math.isfinite(value):
            return FloatingPointError(
                f"the loss term {key} gave {value} at step {step} (config.loss.terms; {what}); "
                "nothing of it was saved. Fix the term so it stays finite"
                + (
                    f", then rerun the same command with --allow_resume_changes (its code "
                    f"changed) to resume from step {good}, kept in {checkpointer.workdir}."
                    if good is not None
                    else ", then start again."
                )
            )
    return FloatingPointError(
        f"non-finite {what} at step {step}; nothing of it was saved. "
        + (
            f"The last good checkpoint, step {good}, is kept in {checkpointer.workdir}; lower "
            "optim.lr or raise optim.warmup_steps, then rerun the same command with "
            "--allow_resume_changes to resume from it."
            if good is not None
            else "No checkpoint was saved yet; lower optim.lr and start again."
        )
    )


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
