"""Training: train state, optimizer, jit-compiled train/eval steps, the loop with checkpoints."""

from __future__ import annotations

import dataclasses
import functools
import math
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from tqdm.auto import tqdm

from minigpt_jax import data, sharding
from minigpt_jax.checkpoint import Checkpointer, CheckpointError
from minigpt_jax.config import GPTConfig, check_experiment_config, gpt_config_from
from minigpt_jax.metrics import MetricsWriter
from minigpt_jax.model import Params, forward, init_params

Array = chex.Array


class TrainState(flax.struct.PyTreeNode):
    """Everything a run needs to continue bit-exactly: data only; `tx` and `cfg` are closed over."""

    step: Array  # int32 scalar: optimizer steps taken
    params: Params
    opt_state: optax.OptState
    rng: Array  # uint32 key data of the dropout key; step n uses fold_in(rng, n)


# ----------------------------------------------------------------------------- optimizer


def decay_mask(params: Params) -> Params:
    """True for weight matrices and embedding tables; not for biases and LayerNorm scales."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: path[-1].key in ("kernel", "embedding"), params
    )


def make_optimizer(
    optim: Any, num_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Global-norm clipping, then AdamW on a linear-warmup + cosine-decay schedule."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.lr,
        warmup_steps=optim.warmup_steps,
        decay_steps=max(num_steps, optim.warmup_steps + 1),
        end_value=optim.min_lr,
    )
    tx = optax.chain(
        optax.clip_by_global_norm(optim.grad_clip),
        optax.adamw(
            schedule,
            b1=optim.b1,
            b2=optim.b2,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
            mask=decay_mask,
        ),
    )
    return tx, schedule


def init_state(cfg: GPTConfig, tx: optax.GradientTransformation, rng: Array) -> TrainState:
    init_rng, dropout_rng = jax.random.split(rng)
    params = init_params(cfg, init_rng)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.key_data(dropout_rng),
    )


# ----------------------------------------------------------------------------- steps


def loss_fn(params: Params, batch_BxT1: Array, cfg: GPTConfig, *, train: bool, rng=None) -> Array:
    """Mean next-token cross-entropy (nats) of batch_BxT1 = inputs [:, :-1], targets [:, 1:]."""
    logits_BxTxV = forward(params, batch_BxT1[:, :-1], cfg, train=train, rng=rng)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits_BxTxV.astype(jnp.float32), batch_BxT1[:, 1:]
    ).mean()


def train_step(
    state: TrainState,
    batch_BxT1: Array,
    *,
    cfg: GPTConfig,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimizer step. Metrics: loss (before the update), grad_norm (before clipping), lr."""
    chex.assert_rank(batch_BxT1, 2)
    dropout_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    loss, grads = jax.value_and_grad(loss_fn)(
        state.params, batch_BxT1, cfg, train=True, rng=dropout_rng
    )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}
    return new_state, metrics


def state_shardings(cfg: GPTConfig, tx: optax.GradientTransformation, mesh: Mesh) -> Any:
    """NamedShardings of the whole train state on `mesh` (from shapes; nothing allocated)."""
    abstract = jax.eval_shape(functools.partial(init_state, cfg, tx), jax.random.key(0))
    return sharding.tree_shardings(abstract, mesh)


def make_init_state(cfg: GPTConfig, tx: optax.GradientTransformation, mesh: Mesh):
    """jit(rng -> TrainState), created directly in its sharded layout on `mesh`."""
    return jax.jit(
        functools.partial(init_state, cfg, tx), out_shardings=state_shardings(cfg, tx, mesh)
    )


def make_train_chunk(
    cfg: GPTConfig,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    mesh: Mesh | None = None,
):
    """jit((state, batches_KxBxT1) -> (state, metrics of shape (K,))): K steps per compiled call
    through `lax.scan`, the state donated. Dispatching once per K steps cuts per-call overhead.
    With a mesh, the state keeps its sharding and the batches split over data × fsdp."""
    step = functools.partial(train_step, cfg=cfg, tx=tx, schedule=schedule)

    def train_chunk(state, batches_KxBxT1):
        return jax.lax.scan(step, state, batches_KxBxT1)

    if mesh is None:
        return jax.jit(train_chunk, donate_argnums=0)
    state_sharding = state_shardings(cfg, tx, mesh)
    return jax.jit(
        train_chunk,
        in_shardings=(state_sharding, sharding.batch_sharding(mesh, 3)),
        out_shardings=(state_sharding, sharding.replicated(mesh)),
        donate_argnums=0,
    )


def eval_step(params: Params, batch_BxT1: Array, *, cfg: GPTConfig) -> tuple[Array, Array]:
    """(sum of token losses, number of tokens): the host divides, so batches can be summed."""
    logits_BxTxV = forward(params, batch_BxT1[:, :-1], cfg)
    losses_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, batch_BxT1[:, 1:])
    return losses_BxT.sum(), jnp.asarray(losses_BxT.size, jnp.int32)


def make_eval_step(cfg: GPTConfig, mesh: Mesh | None = None, params_sharding: Any = None):
    """jit((params, batch_BxT1) -> (loss sum, token count)), sharded like training on a mesh."""
    if mesh is None:
        return jax.jit(functools.partial(eval_step, cfg=cfg))
    return jax.jit(
        functools.partial(eval_step, cfg=cfg),
        in_shardings=(params_sharding, sharding.batch_sharding(mesh, 2)),
        out_shardings=sharding.replicated(mesh),
    )


def evaluate(
    eval_fn, params: Params, tokens: np.ndarray, config: Any, split: str, mesh: Mesh | None = None
) -> float:
    """Mean loss over config.eval_batches fixed batches of a split (the same ones every time)."""
    total, count = 0.0, 0
    for i in range(config.eval_batches):
        batch = data.get_batch(
            tokens,
            config.batch_size,
            config.model.block_size,
            seed=config.seed,
            step=i,
            split=split,
        )
        if mesh is not None:
            batch = sharding.put_batch(batch, sharding.batch_sharding(mesh, 2))
        loss_sum, n = jax.device_get(eval_fn(params, batch))
        total, count = total + float(loss_sum), count + int(n)
    return total / count


# ----------------------------------------------------------------------------- loop


class _StopRequest:
    """Turns SIGINT/SIGTERM into a flag the loop checks between compiled calls."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        del frame
        self.signal_name = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _check_schedule(config: Any) -> None:
    k = config.steps_per_call
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"config.steps_per_call must be a positive integer, got {k!r}.")
    for name in ("num_steps", "eval_every", "checkpoint_every"):
        value = config[name]
        if not isinstance(value, int) or value < 1 or value % k:
            raise ValueError(
                f"config.{name}={value!r} must be a positive multiple of "
                f"steps_per_call={k}: steps run in chunks of {k}."
            )
    for name in ("batch_size", "eval_batches", "log_every", "keep_checkpoints"):
        if not isinstance(config[name], int) or config[name] < 1:
            raise ValueError(f"config.{name} must be a positive integer, got {config[name]!r}.")


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


def train_and_evaluate(
    config: Any, workdir: str | Path, *, progress: bool = True, stop_at: int | None = None
) -> RunSummary:
    """Trains `config` (an experiment ConfigDict) in `workdir`, resuming from its latest checkpoint.

    stop_at: end this call after that step (a multiple of steps_per_call) with a checkpoint, as an
    interruption would; the learning-rate schedule still spans config.num_steps.

    Writes workdir/{tokenizer.json, tokens.npy, metrics.jsonl, tensorboard/, checkpoints/, best/}.
    SIGINT/SIGTERM save a checkpoint and return; a non-finite loss raises FloatingPointError and
    leaves the last good checkpoint in place.
    """
    wall_start = time.perf_counter()
    check_experiment_config(config)
    _check_schedule(config)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    dataset = data.prepare_dataset(
        config.data.corpus,
        config.data.path,
        config.data.tokenizer,
        config.data.vocab_size,
        config.model.block_size,
        workdir,
        config.data.val_fraction,
    )
    cfg = gpt_config_from(config, dataset.tokenizer.vocab_size)
    tx, schedule = make_optimizer(config.optim, config.num_steps)
    mesh = sharding.make_mesh(config.mesh)
    sharding.check_batch_size(config.batch_size, mesh)
    state = make_init_state(cfg, tx, mesh)(jax.random.key(config.seed))
    meta = {"gpt_config": dataclasses.asdict(cfg), "config": config.to_dict()}

    checkpointer = Checkpointer(workdir, config.keep_checkpoints)
    resumed_from, best_val = None, math.inf
    if checkpointer.latest_step() is not None:
        state, saved_meta = checkpointer.restore(state)
        if saved_meta.get("gpt_config") != meta["gpt_config"]:
            raise CheckpointError(
                f"{workdir} holds checkpoints of a different model "
                f"({saved_meta.get('gpt_config')}); this config builds {meta['gpt_config']}. "
                "Use a fresh --workdir."
            )
        resumed_from = int(state.step)
        best_val = saved_meta.get("best_val_loss") or math.inf

    k, batch_size, block_size = config.steps_per_call, config.batch_size, config.model.block_size
    if stop_at is not None and (stop_at < 1 or stop_at % k):
        raise ValueError(f"stop_at={stop_at} must be a positive multiple of steps_per_call={k}.")
    last_step = config.num_steps if stop_at is None else min(stop_at, config.num_steps)

    def batches_from(first_step: int) -> jax.Array:
        """Steps [first_step, first_step + k) of every process's identical global batches."""
        batches = np.stack(
            [
                data.get_batch(dataset.train, batch_size, block_size, seed=config.seed, step=s)
                for s in range(first_step, first_step + k)
            ]
        )
        return sharding.put_batch(batches, sharding.batch_sharding(mesh, 3))

    compile_start = time.perf_counter()
    train_chunk = (
        make_train_chunk(cfg, tx, schedule, mesh)
        .lower(state, batches_from(int(state.step)))
        .compile()
    )
    eval_fn = make_eval_step(cfg, mesh, state_shardings(cfg, tx, mesh).params)
    compile_time = time.perf_counter() - compile_start

    start_step = int(state.step)
    is_main_process = jax.process_index() == 0  # multi-host: one process logs
    writer = MetricsWriter(workdir, resume_step=start_step, enabled=is_main_process)
    tokens_per_chunk = k * batch_size * block_size
    chunk_seconds: list[float] = []
    last = {"train_loss": None, "val_loss": None, "eval_train_loss": None}
    bar = tqdm(
        total=config.num_steps,
        initial=start_step,
        disable=not (progress and is_main_process),
        unit="step",
        dynamic_ncols=True,
    )

    def record(first_step: int, metrics: dict, dispatched_at: float) -> None:
        """Fetches a chunk's metrics (blocking on it), refuses non-finite ones, logs per step."""
        nonlocal ready_at
        metrics = jax.device_get(metrics)
        # The chunk ran from the later of its dispatch and the previous chunk's end until now.
        now = time.perf_counter()
        seconds = now - max(dispatched_at, ready_at)
        ready_at = now
        chunk_seconds.append(seconds)
        tokens_per_sec = tokens_per_chunk / seconds
        for i in range(k):
            step = first_step + i + 1
            loss, grad_norm = float(metrics["loss"][i]), float(metrics["grad_norm"][i])
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                good = checkpointer.latest_step()
                raise FloatingPointError(
                    f"non-finite training loss {loss} (grad norm {grad_norm}) at step {step}. "
                    + (
                        f"The last good checkpoint, step {good}, is kept in "
                        f"{checkpointer.workdir}; lower optim.lr or raise optim.warmup_steps, "
                        "then rerun the same command to resume from it."
                        if good is not None
                        else "No checkpoint was saved yet; lower optim.lr and start again."
                    )
                )
            row = {"train_loss": loss, "grad_norm": grad_norm, "lr": float(metrics["lr"][i])}
            row["tokens_per_sec"] = tokens_per_sec
            writer.write(step, row, tensorboard=step % config.log_every == 0)
            last["train_loss"] = loss
        bar.update(k)
        if (first_step + k) % config.log_every < k:
            bar.set_postfix(loss=f"{last['train_loss']:.4f}", tok_s=f"{tokens_per_sec:,.0f}")

    pending = None  # (first_step, device metrics, dispatched_at) of the chunk in flight
    ready_at = time.perf_counter()  # when the device last finished (or was last idle)
    stop = _StopRequest()
    try:
        with stop:
            for first_step in range(start_step, last_step, k):
                dispatched_at = time.perf_counter()
                state, metrics = train_chunk(state, batches_from(first_step))
                if pending is not None:  # the previous chunk, done by the time this one starts
                    record(*pending)
                pending = (first_step, metrics, dispatched_at)
                end = first_step + k
                evaluate_now = end % config.eval_every == 0 or end == config.num_steps
                save_now = (
                    end % config.checkpoint_every == 0
                    or end == last_step
                    or stop.signal_name is not None
                )
                if not (evaluate_now or save_now):
                    continue
                record(*pending)
                pending = None
                if evaluate_now:
                    last["val_loss"] = evaluate(
                        eval_fn, state.params, dataset.val, config, "val", mesh
                    )
                    last["eval_train_loss"] = evaluate(
                        eval_fn, state.params, dataset.train, config, "train", mesh
                    )
                    writer.write(
                        end,
                        {"val_loss": last["val_loss"], "eval_train_loss": last["eval_train_loss"]},
                    )
                    bar.write(
                        f"step {end}: train loss {last['eval_train_loss']:.4f}, "
                        f"val loss {last['val_loss']:.4f}"
                    )
                    if last["val_loss"] < best_val:
                        best_val = last["val_loss"]
                        checkpointer.save_best(end, state.params, {**meta, "val_loss": best_val})
                if save_now:
                    checkpointer.save(state, {**meta, "best_val_loss": _finite_or_none(best_val)})
                writer.flush()
                ready_at = time.perf_counter()
                if stop.signal_name is not None:
                    bar.write(
                        f"{stop.signal_name} received: checkpoint saved at step {end}; "
                        "rerun the same command to resume."
                    )
                    break
    finally:
        bar.close()
        writer.close()
        checkpointer.close()

    return RunSummary(
        step=int(state.step),
        train_loss=last["train_loss"],
        val_loss=last["val_loss"],
        eval_train_loss=last["eval_train_loss"],
        best_val_loss=_finite_or_none(best_val),
        wall_time_s=time.perf_counter() - wall_start,
        compile_time_s=compile_time,
        median_step_ms=1000 * statistics.median(chunk_seconds) / k if chunk_seconds else None,
        resumed_from=resumed_from,
        interrupted_by=stop.signal_name,
    )


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
