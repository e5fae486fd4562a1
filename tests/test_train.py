"""Training: optimizer, one compile, loss falls, determinism, exact resume, NaN, bad input."""

import dataclasses
import functools
import json
import math
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config

from minigpt_jax.config_dict import gpt_config_from
from minigpt_jax.data.tokenizers import load_tokenizer
from minigpt_jax.optimizers import decay_mask, make_optimizer
from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.train.loop import train_and_evaluate
from minigpt_jax.train.metrics import read_metrics
from minigpt_jax.train.step import accumulated_value_and_grad, init_state, loss_fn, make_train_chunk
from minigpt_jax.typed_config import build_experiment


@pytest.fixture(scope="module")
def full_run(corpus_file, tmp_path_factory):
    """The tiny config trained 40 steps in one go."""
    workdir = tmp_path_factory.mktemp("full")
    summary = train_and_evaluate(
        build_experiment(tiny_config(corpus_file)), workdir, progress=False
    )
    return workdir, summary


@pytest.fixture(scope="module")
def resumed_run(corpus_file, tmp_path_factory):
    """The same config trained 20 steps, stopped, then resumed to 40 by rerunning."""
    workdir = tmp_path_factory.mktemp("resumed")
    first = train_and_evaluate(
        build_experiment(tiny_config(corpus_file)), workdir, progress=False, stop_at=20
    )
    second = train_and_evaluate(build_experiment(tiny_config(corpus_file)), workdir, progress=False)
    return workdir, first, second


def _train_losses(workdir):
    return [r["train_loss"] for r in read_metrics(workdir) if "train_loss" in r]


def test_loss_falls_within_a_few_dozen_steps(full_run):
    workdir, summary = full_run
    losses = _train_losses(workdir)
    assert len(losses) == 40
    vocab_size = load_tokenizer(workdir / "tokenizer.json").vocab_size
    assert abs(losses[0] - math.log(vocab_size)) < 0.3, "the loss at init should be about log(V)"
    assert np.mean(losses[-5:]) < losses[0] - 0.8, losses
    assert summary.val_loss < losses[0] - 0.8


def test_metrics_file_has_the_promised_fields(full_run):
    records = read_metrics(full_run[0])
    steps = [r for r in records if "train_loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 41))
    assert all({"lr", "grad_norm"} <= set(r) for r in steps)
    assert sum("tokens_per_sec" in r for r in steps) >= 35
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [20, 40]
    assert list((full_run[0] / "tensorboard").glob("events.out.tfevents.*"))


def test_same_seed_twice_gives_identical_losses(full_run, resumed_run):
    """Two separate runs with one seed: the first 20 steps match bit for bit."""
    assert _train_losses(resumed_run[0])[:20] == _train_losses(full_run[0])[:20]


def test_resume_equals_uninterrupted_training(full_run, resumed_run):
    workdir, first, second = resumed_run
    assert (first.step, second.step, second.resumed_from) == (20, 40, 20)
    assert _train_losses(workdir) == _train_losses(full_run[0])
    resumed_params, _ = load_params(workdir)
    full_params, _ = load_params(full_run[0])
    chex.assert_trees_all_equal(resumed_params, full_params)


def test_best_checkpoint_holds_the_lowest_val_loss(full_run):
    params, meta = load_params(full_run[0], which="best")
    vals = [r["val_loss"] for r in read_metrics(full_run[0]) if "val_loss" in r]
    assert meta["val_loss"] == pytest.approx(min(vals))
    chex.assert_tree_all_finite(params)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(corpus_file, full_run, tmp_path):
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(full_run[0], workdir)
    good_params, _ = load_params(workdir)
    config = tiny_config(
        corpus_file, num_steps=60, **{"optim.lr": 99.0, "optim.schedule": "constant"}
    )
    # Diverged at once after the resume: checkpoint 40 set aside as possibly damaged, the run
    # trains again from 20 and diverges again: its own divergence, 40 kept (issue 54).
    with pytest.raises(
        FloatingPointError,
        match=r"set checkpoint 40 aside .* again from step 20: diverging again, .*Both "
        r"checkpoints are kept .* resume from step 40 \(move it aside to resume from step 20\)",
    ):
        train_and_evaluate(
            build_experiment(config), workdir, progress=False, allow_resume_changes=True
        )
    params, _ = load_params(workdir)
    chex.assert_trees_all_equal(params, good_params)


def test_train_chunk_compiles_once_and_scan_equals_single_steps(corpus_file):
    config = tiny_config(corpus_file)
    cfg = gpt_config_from(config, vocab_size=40)
    tx, schedule = make_optimizer(config.optim, config.num_steps)
    batches = np.random.default_rng(0).integers(0, 40, (4, 2, 9)).astype(np.int32)
    chex.clear_trace_counter()
    step = make_train_chunk(cfg, tx, schedule)
    # One trace for K=1 chunks, however many calls; K=4 is another shape, so one more.
    counted = jax.jit(chex.assert_max_traces(step.__wrapped__, n=1), donate_argnums=0)
    state = init_state(cfg, tx, jax.random.key(0))
    for i in range(4):
        state, _ = counted(state, batches[i : i + 1])
    together, metrics = step(init_state(cfg, tx, jax.random.key(0)), batches)
    chex.assert_shape(metrics["loss"], (4,))
    chex.assert_trees_all_close(together.params, state.params, atol=1e-6, rtol=1e-6)
    chex.clear_trace_counter()


def test_weight_decay_skips_biases_and_layer_norms():
    from minigpt_jax import GPTConfig, init_params

    mask = decay_mask(init_params(GPTConfig(n_layer=1), jax.random.key(0)))
    assert mask["embed"]["tok"]["embedding"] and mask["embed"]["pos"]["embedding"]
    assert mask["block_0"]["attn"]["qkv"]["kernel"] and mask["block_0"]["mlp"]["fc"]["kernel"]
    assert not mask["block_0"]["attn"]["qkv"]["bias"]
    assert not mask["block_0"]["ln_1"]["scale"] and not mask["ln_f"]["bias"]


def test_config_key_typo_lists_the_valid_keys(corpus_file, tmp_path):
    config = tiny_config(corpus_file)
    config.model.n_layr = 3
    with pytest.raises(ValueError, match=r"config.model.n_layr \(did you mean 'n_layer'\?\)"):
        train_and_evaluate(build_experiment(config), tmp_path, progress=False)


def test_missing_corpus_says_where_to_put_it(corpus_file, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGPT_JAX_DATA", str(tmp_path / "empty"))
    config = tiny_config(corpus_file, **{"data.corpus": "shakespeare", "data.path": None})
    with pytest.raises(FileNotFoundError, match="MINIGPT_JAX_DATA"):
        train_and_evaluate(build_experiment(config), tmp_path / "run", progress=False)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("eval_every", 7, "multiple of steps_per_call=2"),
        ("steps_per_call", 0, "steps_per_call must be a positive integer"),
        ("batch_size", 0, "batch_size must be a positive integer"),
        ("grad_accum_steps", 3, "does not split into grad_accum_steps=3"),
    ],
)
def test_bad_schedule_values_are_named(corpus_file, tmp_path, key, value, message):
    config = tiny_config(corpus_file, **{"steps_per_call": 2, key: value})
    with pytest.raises(ValueError, match=message):
        train_and_evaluate(build_experiment(config), tmp_path, progress=False)


def test_multi_step_calls_match_single_steps(corpus_file, full_run, tmp_path):
    """steps_per_call=4 (lax.scan over 4 batches) trains the very same model."""
    summary = train_and_evaluate(
        build_experiment(tiny_config(corpus_file, steps_per_call=4)), tmp_path, progress=False
    )
    assert summary.step == 40
    np.testing.assert_allclose(
        _train_losses(tmp_path), _train_losses(full_run[0]), rtol=1e-5, atol=1e-5
    )


def test_grad_accumulation_equals_one_k_times_larger_batch(corpus_file):
    """grad_accum_steps=4 micro-batches of 2: the loss, gradients and updates of the batch of 8."""
    config = tiny_config(corpus_file)
    # float32 matmuls on every CPU: the claim is float32 equality of the two updates.
    cfg = gpt_config_from(config, vocab_size=40).replace(matmul_dtype="float32")
    tx, schedule = make_optimizer(config.optim, config.num_steps)
    batches = np.random.default_rng(1).integers(0, 40, (3, 8, 17)).astype(np.int32)
    params = init_state(cfg, tx, jax.random.key(0)).params
    rng = jax.random.key(1)
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, batches[0], cfg, train=True, rng=rng
    )
    (loss_4, aux_4), grads_4 = jax.jit(accumulated_value_and_grad, static_argnums=(2, 4))(
        params, batches[0], cfg, rng, 4
    )
    assert aux == aux_4 == {}  # no loss terms: nothing beside the cross-entropy
    np.testing.assert_allclose(loss_4, loss, rtol=1e-6)
    chex.assert_trees_all_close(grads_4, grads, rtol=1e-5, atol=1e-7)
    states = {}
    for accum in (1, 4):
        step = make_train_chunk(cfg, tx, schedule, grad_accum_steps=accum)
        states[accum], _ = step(init_state(cfg, tx, jax.random.key(0)), batches)
    chex.assert_trees_all_close(states[4].params, states[1].params, rtol=1e-5, atol=1e-6)


def test_gpt_config_round_trips_through_checkpoint_meta(full_run):
    from minigpt_jax import GPTConfig

    _, meta = load_params(full_run[0])
    cfg = GPTConfig(**meta["gpt_config"])
    # (JSON holds entry_settings' pairs as lists)
    assert json.loads(json.dumps(dataclasses.asdict(cfg))) == meta["gpt_config"]
    assert functools.reduce(lambda a, b: a * b, (cfg.n_layer, cfg.n_embd)) == 64
    assert jnp.dtype(cfg.dtype) == jnp.float32


def test_bfloat16_compute_trains_with_float32_params(corpus_file, tmp_path):
    """Mixed precision: bf16 activations, float32 params, logits and loss; the loss falls."""
    config = tiny_config(corpus_file, **{"model.dtype": "bfloat16"})
    summary = train_and_evaluate(build_experiment(config), tmp_path, progress=False)
    losses = _train_losses(tmp_path)
    assert np.mean(losses[-5:]) < losses[0] - 0.8, losses
    assert summary.val_loss < losses[0] - 0.8
    params, meta = load_params(tmp_path)
    assert meta["gpt_config"]["dtype"] == "bfloat16"
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {np.dtype("float32")}


def test_a_resumed_run_builds_its_model_config_once(corpus_file, full_run, tmp_path, monkeypatch):
    """Issue 35: GPTConfig was rebuilt from the ConfigDict (complete() and all) 6 times on a
    resume. Now the config is completed, checked and typed once at the edge
    (typed_config.build_experiment), its model group with it; the run sets vocab_size by
    `replace` as each phase learns it."""
    from minigpt_jax import config_dict

    workdir = tmp_path / "run"
    shutil.copytree(full_run[0], workdir)
    completions, model_builds = [], []
    complete, gpt_config = config_dict.complete, config_dict._gpt_config
    monkeypatch.setattr(config_dict, "complete", lambda c: completions.append(1) or complete(c))
    monkeypatch.setattr(
        config_dict,
        "_gpt_config",
        lambda c, vocab_size: model_builds.append(vocab_size) or gpt_config(c, vocab_size),
    )
    summary = train_and_evaluate(
        build_experiment(tiny_config(corpus_file)), workdir, progress=False
    )
    assert summary.resumed_from == 40
    assert len(completions) == 1
    assert model_builds == [1]
