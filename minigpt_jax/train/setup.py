"""A run's setup, everything before its first step (`set_up`): the checkpoints checked, the
pretrained model, the optimizer, loss terms and metrics, the mesh, the memory budget, the resume
rules, the data, the train state (restored or initialized) and the compiled steps.

Every check that can refuse the config runs before anything is written: the data is checked
before it is cached, a resumed run's settings before its data changes, its token stream against
the checkpoint's before a data file is rewritten, and `before_writing()` (taking the run lock)
is called before the first write.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from minigpt_jax import budget, sharding
from minigpt_jax.data import dataset as data
from minigpt_jax.data.formats import dataset_from
from minigpt_jax.finetune import fitted_params, new_parameters
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.leaks import remat_leak
from minigpt_jax.model.loss_terms import PickedTerm, parse_terms, term_name
from minigpt_jax.model.speed.kernels import choose_kernel
from minigpt_jax.model_files import LoadedModel, load_model
from minigpt_jax.optimizers import OptimizerParts, build_optimizer
from minigpt_jax.runtime.checkpoint import Checkpointer
from minigpt_jax.settings.registry import is_user_key, user_module_digests, user_modules
from minigpt_jax.settings.shape_schedule import ShapeSchedule
from minigpt_jax.train.eval_metrics import metric_name, parse_metrics
from minigpt_jax.train.eval_step import check_metrics, make_eval_step, make_metric_step
from minigpt_jax.train.gradients import step_gradient
from minigpt_jax.train.metrics import reserved_key
from minigpt_jax.train.resume import check_resume, check_resume_data, check_resume_plugins
from minigpt_jax.train.step import (
    TrainState,
    init_state,
    make_init_state,
    make_train_chunk,
    state_shardings,
)
from minigpt_jax.train.step_metrics import parse_step_metrics
from minigpt_jax.typed_config import Experiment

_log = logging.getLogger(__name__)
OnPhase = Callable[[str, "int | None"], None]  # (setup step starting, step the run stands at)


@dataclasses.dataclass
class Run:
    """What a run needs from its first step on (made by `set_up`)."""

    config: Experiment
    cfg: GPTConfig
    dataset: data.Dataset
    mesh: Any
    shardings: Any  # of the train state
    checkpointer: Checkpointer
    state: TrainState
    resumed_from: int | None
    best_val: float  # the lowest val loss so far (inf: none yet)
    pending_evaluation: bool  # a signal stopped the resumed step's evaluation: it runs first
    terms: tuple[PickedTerm, ...]  # config.loss.terms, parsed
    meta: dict  # what every checkpoint records beside the state
    train_batches: Callable[[int], jax.Array]  # first_step -> batches (C, B, T + 1), on the mesh
    train_chunk: Any  # (state, batches_CxBxT1) -> (state, metrics), compiled per batch shape
    # (ChunkPerShape); None: nothing to train
    eval_fn: Any  # compiled (params, batch_BxT1) -> (sums, count)
    metric_fn: Any  # compiled (params, batch_BxT1) -> {metric: value}, or None
    select_eval_params: Any  # compiled state -> eval params, or None: the trained ones
    compile_time_s: float

    @property
    def step(self) -> int:
        return int(self.state.step)

    def eval_params(self) -> Any:
        """The params evaluation, best/, sampling and export use (optim.eval_params): the
        trained ones, or what the optimizer's hook selects from the train state."""
        if self.select_eval_params is None:
            return self.state.params
        return self.select_eval_params(self.state)


def set_up(
    config: Experiment,
    workdir: Path,
    *,
    progress: bool = False,
    allow_resume_changes: bool = False,
    before_writing: Callable[[], None] = lambda: None,
    on_phase: OnPhase = lambda phase, step: None,
    last_step: int | None = None,
) -> Run:
    """The run of the experiment `config` in `workdir`. on_phase(what, step) names each setup
    step as it starts ("reading the data", ...) and the step the run stands at (None until the
    checkpoints are checked). A run already at last_step compiles no train step (it has
    nothing to train)."""
    checkpointer = Checkpointer(
        workdir, config.keep_checkpoints, write_digests=jax.process_index() == 0
    )
    try:
        # The checkpoints first: every later phase then names the step the run stands at.
        on_phase("checking the checkpoints", None)
        latest = checkpointer.latest_step()
        at = latest or 0
        # A pretrained model brings its tokenizer and vocabulary (config.data's are then unused).
        if config.init_from:
            on_phase("reading config.init_from", at)
        pretrained = load_model(config.init_from) if config.init_from else None
        on_phase("checking the model's memory and the optimizer", at)
        plan = _plan(config, checkpointer, latest, pretrained, allow_resume_changes)
        on_phase("reading the data", at)
        data_check = _DataCheck(config, checkpointer, latest, allow_resume_changes)
        dataset = dataset_from(
            config,
            workdir,
            pretrained.tokenizer if pretrained else None,
            progress=progress,
            before_writing=before_writing,
            check_data=data_check if latest is not None else None,
            documents=config.model.parts.mask.documents,
        )
        cfg = _model_of(config, plan, dataset, pretrained)
        shardings = state_shardings(cfg, plan.optimizer.tx, plan.mesh)
        # Which params evaluation, best/, sampling and export use, decided by the optimizer.
        eval_params_name, select = plan.optimizer.eval_params(shardings.opt_state)
        meta = {
            "gpt_config": dataclasses.asdict(cfg),
            "config": config.to_dict(),
            "data": dataset.digest.as_dict(),
            "eval_params": eval_params_name,
            "plugins": user_module_digests(config),
        }
        before_writing()
        checkpointer.start_writing()
        state = make_init_state(cfg, plan.optimizer.tx, plan.mesh, shardings)(
            jax.random.key(config.seed)
        )
        if latest is None:
            on_phase("initializing the model", 0)
            state = _with_pretrained_params(state, pretrained, cfg, shardings)
            resumed_from, best_val, pending_evaluation = None, math.inf, False
        else:
            on_phase(f"restoring checkpoint {latest}", latest)
            state, saved_meta = _restored(
                config, cfg, plan, checkpointer, latest, allow_resume_changes, state
            )
            resumed_from = int(state.step)
            pending_evaluation = bool(saved_meta.get("pending_evaluation"))
            best_val = _best_val_so_far(saved_meta, latest, data_check.change)
        run = Run(
            config, cfg, dataset, plan.mesh, shardings, checkpointer, state, resumed_from,
            best_val, pending_evaluation, plan.terms, meta,
            data.train_batches(
                dataset.train,
                ShapeSchedule.of(config),
                seed=config.seed,
                steps_per_call=config.steps_per_call,
                batch_sharding=sharding.batch_sharding(plan.mesh, 3),
            ), None,
            make_eval_step(cfg, plan.mesh, shardings.params, plan.terms),
            make_metric_step(cfg, plan.metrics, plan.mesh, shardings.params)
            if plan.metrics else None,
            _eval_params_selector(select, shardings), 0.0,
        )  # fmt: skip
        if last_step is None or run.step < last_step:
            on_phase("compiling", run.step)
            _compile(run, plan.optimizer, last_step or config.num_steps)
        return run
    except jax.errors.UnexpectedTracerError as error:  # a plug-in's value escaped model.remat
        checkpointer.close()
        leak = remat_leak(error, config.model)
        if leak is error:
            raise
        raise leak from error
    except BaseException:
        checkpointer.close()  # an open orbax manager prints tracebacks at exit
        raise


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What `_plan` checked before any data is read: the optimizer, the loss terms, the
    evaluation metrics, the device mesh, and the model config whose memory (and, on a resume,
    whose settings: `resume_changes`, those allowed) it checked, with the vocabulary known so
    far: the run's own model when the data's vocabulary is the same (checked once)."""

    optimizer: OptimizerParts
    terms: tuple[PickedTerm, ...]
    metrics: tuple[str, ...]
    mesh: Any
    model: GPTConfig
    resume_changes: list[str] | None  # None: a fresh run


def _plan(
    config: Experiment,
    checkpointer: Checkpointer,
    latest: int | None,
    pretrained: LoadedModel | None,
    allow_resume_changes: bool,
) -> _Plan:
    """The checks that need no data, before any is read: the optimizer, loss terms and metrics
    resolve, the batch splits over the mesh, the run fits the devices' memory (with the
    vocabulary known so far), a fresh run's model can take config.init_from's weights, and a
    resume's settings are allowed, so a refused resume changes no data file."""
    optimizer = build_optimizer(config.optim, config.num_steps, config.model)
    terms = parse_terms(config.loss.terms, config.loss)
    metrics = _checked_metrics(config, terms, config.model, pretrained)
    mesh = sharding.make_mesh(config.mesh)
    sharding.check_batch_size(config.micro_batch_size, mesh)
    for batch_size in ShapeSchedule.of(config).batch_size.values:
        try:
            sharding.check_batch_size(batch_size // config.grad_accum_steps, mesh)
        except ValueError as error:
            raise ValueError(f"config.batch_size_schedule: {error}") from None
    # The vocabulary known so far: a resume's saved one, a pretrained model's, BPE's setting;
    # a char vocabulary is known once the corpus is read: counted as 1 until then.
    if latest is not None:
        vocab_size = checkpointer.read_meta(latest).get("gpt_config", {}).get("vocab_size", 1)
    elif pretrained is not None:
        vocab_size = pretrained.cfg.vocab_size
    else:
        vocab_size = config.data.vocab_size if config.data.tokenizer == "bpe" else 1
    model = config.model.replace(vocab_size=vocab_size)
    _check_memory(config, optimizer.tx, mesh, model)
    if pretrained is not None and latest is None:
        _check_init_from(pretrained, model)
    changes = None
    if latest is not None:
        changes = _check_resume(config, model, checkpointer, latest, allow_resume_changes)
    return _Plan(optimizer, terms, metrics, mesh, model, changes)


def _check_init_from(pretrained: LoadedModel, cfg: GPTConfig) -> None:
    """Refuses a model (with the pretrained vocabulary) that config.init_from's weights cannot
    become (finetune.new_parameters); logs the new parameters (a plug-in's), which start from
    the model's init."""
    new = new_parameters(pretrained, cfg)
    if new:
        _log.warning(
            "config.init_from: %d parameters the checkpoint lacks start from the model's init: %s",
            len(new),
            ", ".join(new),
        )


def _model_of(
    config: Experiment,
    plan: _Plan,
    dataset: data.Dataset,
    pretrained: LoadedModel | None,
) -> GPTConfig:
    """The run's model: config.model with the vocabulary of the pretrained model or the data's
    tokenizer, checked against the devices' memory and the tokenizer's end-of-text id (a mask
    that packs documents)."""
    vocab_size = (pretrained.cfg if pretrained else dataset.tokenizer).vocab_size
    cfg = plan.model
    if vocab_size != cfg.vocab_size:
        cfg = config.model.replace(vocab_size=vocab_size)
        _check_memory(config, plan.optimizer.tx, plan.mesh, cfg)
    _check_documents(cfg, pretrained.tokenizer if pretrained else dataset.tokenizer)
    return cfg


def _restored(
    config: Experiment,
    cfg: GPTConfig,
    plan: _Plan,
    checkpointer: Checkpointer,
    latest: int,
    allow_resume_changes: bool,
    state: TrainState,
) -> tuple[TrainState, dict]:
    """(state, meta) of checkpoint `latest`, restored into `state`'s shapes and shardings once
    its settings pass the resume rules with the data's vocabulary (`_plan` checked them with
    the saved one: checked again only when the data's differs, which they refuse); changes
    allowed by allow_resume_changes are logged."""
    changes = plan.resume_changes
    if cfg is not plan.model or changes is None:
        changes = _check_resume(config, cfg, checkpointer, latest, allow_resume_changes)
    if changes:
        _log.warning("resuming step %d with changed settings: %s", latest, "; ".join(changes))
    return checkpointer.restore(state, latest)


def _eval_params_selector(select: Callable | None, shardings: Any) -> Callable | None:
    """The compiled state -> eval params of the optimizer's `select` (e.g. its EMA), or None
    when evaluation reads the trained params."""
    if select is None:
        return None
    return jax.jit(
        lambda state: select(state.opt_state, state.params), out_shardings=shardings.params
    )


class ChunkPerShape:
    """(state, batches_CxBxT1) -> (state, metrics), by the compiled chunk of the batches' shape
    (`compiled`: {(B, T): compiled chunk}, one per shape of the schedule). `of` gives the one
    compiled chunk itself where there is one shape."""

    @classmethod
    def of(cls, compiled: dict[tuple[int, int], Any]) -> Any:
        return next(iter(compiled.values())) if len(compiled) == 1 else cls(compiled)

    def __init__(self, compiled: dict[tuple[int, int], Any]):
        self.compiled = compiled

    def __call__(self, state: Any, batches_CxBxT1: Any) -> Any:
        _, rows, width = batches_CxBxT1.shape
        return self.compiled[rows, width - 1](state, batches_CxBxT1)


def _compile(run: Run, optimizer: OptimizerParts, last_step: int) -> None:
    """Compiles the train chunk of each batch shape the steps from run.step to last_step
    take (settings.shape_schedule; one without a schedule) ahead of its first call, refuses one
    that XLA's account says will not fit, and times them."""
    start = time.perf_counter()
    step_metrics = parse_step_metrics(run.config.step_metrics)

    def lowered(donate: bool, batches: jax.Array) -> Any:
        chunk = make_train_chunk(
            run.cfg,
            optimizer.tx,
            optimizer.schedule,
            run.mesh,
            run.shardings,
            grad_accum_steps=run.config.grad_accum_steps,
            terms=run.terms,
            step_metrics=step_metrics,
            gradient=step_gradient(run.config.optim),
            donate=donate,
        )
        return chunk.lower(run.state, batches)

    compiled = {}
    for shape, first_step in ShapeSchedule.of(run.config).first_steps(run.step, last_step).items():
        batches = run.train_batches(first_step)
        chunk = lowered(True, batches)
        # A step metric's host callback can fail after the state went in: kept (not donated),
        # the steps trained before the failing call can still be saved (train.recovery).
        if any(is_user_key(key) for key in step_metrics) and "callback" in chunk.as_text():
            chunk = lowered(False, batches)
        compiled[shape] = chunk.compile()
        budget.check_compiled_fits(compiled[shape], run.mesh)
    run.train_chunk = ChunkPerShape.of(compiled)
    run.compile_time_s = time.perf_counter() - start


def _check_documents(cfg: GPTConfig, tokenizer: Any) -> None:
    """A mask that packs documents reads the end-of-text id as V - 1 (model.gpt.document_layout):
    refuses a tokenizer whose end-of-text id is another, or that has none."""
    if cfg.parts.mask.documents and tokenizer.eot_id != cfg.vocab_size - 1:
        raise ValueError(
            f"model.attention_mask={cfg.attention_mask!r} packs documents at the end-of-text "
            f"id, the vocabulary's last ({cfg.vocab_size - 1}), but the tokenizer's is "
            f"{tokenizer.eot_id}: use a tokenizer that puts its end-of-text id last (the "
            f"built-in char and bpe ones do), or model.attention_mask=causal."
        )


def _checked_metrics(
    config: Experiment,
    terms: tuple[PickedTerm, ...],
    model: GPTConfig,
    pretrained: LoadedModel | None,
) -> tuple[str, ...]:
    """config.eval.metrics resolved and probed against their contract (shapes only), before
    anything is written; a name clashing with a loss term's is refused."""
    metrics = parse_metrics(config.eval.metrics)
    for key in (term.key for term in terms):
        what = reserved_key(term_name(key))
        if what is not None:
            raise ValueError(
                f"config.loss.terms: {key!r} is logged as {term_name(key)!r}, a key the run's "
                f"record writes ({what}); rename the term (its attr in module:attr)."
            )
    taken = {"loss", "cross_entropy", *(term_name(term.key) for term in terms)}
    for key in metrics:
        if metric_name(key) in taken:
            raise ValueError(
                f"config.eval.metrics: {key!r} is logged as {metric_name(key)!r}, the name "
                "of a loss value; rename the metric (its attr in module:attr)."
            )
    if metrics:
        vocab_size = pretrained.cfg.vocab_size if pretrained else 256
        check_metrics(model.replace(vocab_size=vocab_size), metrics)
    return metrics


def _check_memory(config: Experiment, tx: Any, mesh: Any, cfg: GPTConfig) -> None:
    """Refuses, before any array is allocated, a run of model `cfg` whose state, batches,
    logits and residual stream alone (budget.train_bytes_lower_bound, from shapes) exceed the
    devices' memory."""
    state_shapes = jax.eval_shape(functools.partial(init_state, cfg, tx), jax.random.key(0))
    fused = choose_kernel(cfg, weight_dropout=cfg.dropout > 0, cached=False) == "cudnn"
    batches = (config.steps_per_call, config.batch_size, config.model.block_size + 1)
    needed = budget.train_bytes_lower_bound(
        cfg, state_shapes, config.micro_batch_size, batches, fused_attention=fused
    )
    budget.check_train_fits(needed, mesh)


def _check_resume(
    config: Experiment, cfg: GPTConfig, checkpointer: Checkpointer, latest: int, allow_changes: bool
) -> list[str]:
    """The accepted changes of resuming checkpoint `latest` with `config` and its model `cfg`;
    raises ValueError for changed model or (unless allowed) trajectory settings or plug-in
    code (train.resume), or a checkpoint past config.num_steps."""
    saved = checkpointer.read_meta(latest)
    where = checkpointer.run_dir.checkpoints / str(latest)
    meta = {"gpt_config": dataclasses.asdict(cfg), "config": config.to_dict()}
    changes = check_resume(saved, meta, where, allow_changes=allow_changes)
    changes += check_resume_plugins(
        saved.get("plugins"),
        user_module_digests(config),
        user_modules(config),
        where,
        allow_changes=allow_changes,
    )
    if latest > config.num_steps:
        raise ValueError(
            f"{where} is past num_steps={config.num_steps}, so there is nothing to train; "
            f"raise --config.num_steps above {latest} to continue it, or use a fresh --workdir."
        )
    return changes


class _DataCheck:
    """Called by the data loading with the token stream's digest before any data file is
    rewritten: refuses another stream than checkpoint `latest` trained on (resume.
    check_resume_data); with allow_changes notes the change (`change`), after which the best val
    loss starts afresh."""

    def __init__(
        self, config: Experiment, checkpointer: Checkpointer, latest: int | None, allow: bool
    ):
        self.config, self.checkpointer, self.latest, self.allow = (
            config,
            checkpointer,
            latest,
            allow,
        )
        self.change: str | None = None

    def __call__(self, digest: data.DataDigest) -> None:
        data_config = self.config.data
        self.change = check_resume_data(
            self.checkpointer.read_meta(self.latest).get("data"),
            digest.as_dict(),
            self.checkpointer.run_dir.checkpoints / str(self.latest),
            where=f"data.path={data_config.path}"
            if data_config.path
            else f"data.corpus={data_config.corpus}",
            allow_changes=self.allow,
        )


def _with_pretrained_params(
    state: TrainState, pretrained: LoadedModel | None, cfg: GPTConfig, shardings: Any
) -> TrainState:
    """A fresh state whose params are config.init_from's where the checkpoint has them, the
    model's init elsewhere (a plug-in's new parameters: finetune.fitted_params); AdamW's
    moments start at zero whatever the params, so only the params change."""
    if pretrained is None:
        return state
    # Host arrays, the same on every process, which device_put places on any mesh.
    params = fitted_params(state.params, pretrained, cfg)
    return state.replace(params=jax.device_put(params, shardings.params))


def _best_val_so_far(saved_meta: dict, latest: int, data_change: str | None) -> float:
    """The best val loss checkpoint `latest` recorded; afresh (inf) on other data, whose
    validation split is not the one it was measured on."""
    best_val = saved_meta.get("best_val_loss") or math.inf
    if data_change is None:
        return best_val
    _log.warning(
        "resuming step %d on other data (%s): the best val loss so far (%.4f) was measured on "
        "a validation split that is gone, so it starts afresh.",
        latest,
        data_change,
        best_val,
    )
    return math.inf
