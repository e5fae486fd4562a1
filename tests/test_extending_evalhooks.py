"""Optax factories by name, the parameters evaluation uses (schedule-free's x, an EMA) and
metrics over the model's intermediates: docs/extending/'s examples, written into a folder
outside the package, trained through the command line, and checked against independent
computations of what each says."""

import subprocess
import sys
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import extending_files, pydoc_text, tensorboard_scalars, train_args

from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.config_dict import check_experiment_config, default_config
from minigpt_jax.data.dataset import get_batch
from minigpt_jax.data.formats import dataset_from
from minigpt_jax.model import param_meta
from minigpt_jax.model.gpt import forward_with_attention
from minigpt_jax.optimizers import build_optimizer, decay_mask, make_optimizer
from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.settings.registry import RegistryError
from minigpt_jax.train.metrics import read_metrics

# The full suite only (`python -m pytest -q`): plug-ins trained through the CLI.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MINE = ("my_schedule_free.py", "my_metrics.py")
STEPS = 20


def doc_files() -> dict[str, str]:
    return extending_files()


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """A folder outside the package holding the docs' files and two broken plug-ins."""
    folder = tmp_path_factory.mktemp("user_code")
    files = doc_files()
    for name in MINE:
        folder.joinpath(name).write_text(files[name])
    folder.joinpath("broken.py").write_text(
        "import jax.numpy as jnp\n\n\n"
        "def three(optim, learning_rate):\n    return 3\n\n\n"
        "def vector(params, batch_BxT1, intermediates, cfg):\n"
        "    return jnp.zeros(3)\n"
    )
    (folder / "corpus.txt").write_text(pydoc_text())
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def _args(user_dir, workdir, *extra):
    return train_args(
        workdir,
        user_dir / "corpus.txt",
        f"--config.num_steps={STEPS}",
        "--config.eval_every=10",
        "--config.checkpoint_every=10",
        *extra,
    )


def _train(user_dir, workdir, *extra):
    # The user's folder is the working directory, as for a researcher running their study.
    result = subprocess.run(
        _args(user_dir, workdir, *extra), capture_output=True, text=True, timeout=600, cwd=user_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _refused(user_dir, workdir, *extra):
    result = subprocess.run(
        _args(user_dir, workdir, *extra), capture_output=True, text=True, timeout=600, cwd=user_dir
    )
    assert result.returncode != 0
    assert not workdir.exists()  # refused before anything was written
    return result.stderr


def _run_config(user_dir, *overrides):
    """The complete config `_train` runs (tiny.py with the same overrides)."""
    sys.path.insert(0, str(REPO))
    try:
        from configs import tiny
    finally:
        sys.path.remove(str(REPO))
    config = tiny.get_config()
    config.data.corpus, config.data.path = "text", str(user_dir / "corpus.txt")
    config.num_steps = STEPS
    for dotted, value in overrides:
        group, _, key = dotted.partition(".")
        config[group][key] = value
    return check_experiment_config(config)


def _val_batches(config, workdir):
    """The fixed val batches every evaluation of the run uses."""
    dataset = dataset_from(config, workdir)
    micro, block = config.batch_size // config.grad_accum_steps, config.model.block_size
    return [
        get_batch(dataset.val, micro, block, seed=config.seed, step=i, split="val")
        for i in range(config.eval_batches)
    ]


def _loss(params, cfg, batches) -> float:
    """The mean next-token cross-entropy of `params` over the batches, by the model's forward."""
    losses = []
    for batch_BxT1 in batches:
        logits_BxTxV = forward(params, jnp.asarray(batch_BxT1[:, :-1]), cfg)
        losses.append(
            optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, batch_BxT1[:, 1:])
        )
    return float(jnp.concatenate([x.reshape(-1) for x in losses]).mean())


def test_the_docs_hold_these_examples():
    assert set(MINE) <= set(doc_files())


# ----------------------------------------------------------------------------- optax factories


def test_optax_factory_by_name_is_filled_from_the_optim_settings():
    """optax:lion's update equals clipping, then optax.lion on the schedule with the optim
    group's betas, decay and mask; adafactor and schedule-free AdamW build by name too."""
    config = default_config()
    config.optim.name = "optax:lion"
    tx, schedule = make_optimizer(config.optim, 100)
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    params = init_params(cfg, jax.random.key(0))
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update(grads, state, params)
    reference = optax.chain(
        optax.clip_by_global_norm(config.optim.grad_clip),
        optax.lion(schedule, b1=0.9, b2=0.99, weight_decay=0.1, mask=decay_mask),
    )
    ref_state = reference.init(params)
    for _ in range(2):
        expected, ref_state = reference.update(grads, ref_state, params)
    chex.assert_trees_all_close(updates, expected, rtol=1e-6, atol=0)
    for name in ("optax:adafactor", "optax.contrib:schedule_free_adamw"):
        config.optim.name = name
        tx, _ = make_optimizer(config.optim, 100)
        updates, _ = tx.update(grads, tx.init(params), params)
        assert all(bool(jnp.isfinite(u).all()) for u in jax.tree.leaves(updates))


def test_optax_factory_by_name_trains(user_dir, tmp_path):
    _train(user_dir, tmp_path / "lion", "--config.optim.name=optax:lion")
    records = [r for r in read_metrics(tmp_path / "lion") if "val_loss" in r]
    assert [r["step"] for r in records] == [10, 20]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    assert load_params(tmp_path / "lion")[1]["eval_params"] == "params"


def test_a_factory_with_an_unfillable_argument_is_refused_naming_it(user_dir, tmp_path):
    stderr = _refused(user_dir, tmp_path / "run", "--config.optim.name=optax.contrib:schedule_free")
    assert "schedule_free needs base_optimizer" in stderr
    assert "wrapper" in stderr and "--config.optim.name=my_file:my_opt" in stderr
    assert "Traceback" not in stderr


def test_an_optimizer_returning_something_else_is_refused_naming_the_contract(user_dir, tmp_path):
    stderr = _refused(user_dir, tmp_path / "run", "--config.optim.name=broken:three")
    assert "returned int (3), not an optax.GradientTransformation" in stderr
    assert "(optim, learning_rate) -> optax.GradientTransformation" in stderr


# ----------------------------------------------------------------------------- eval params


def test_schedule_free_is_evaluated_at_x_not_at_the_trained_y(user_dir, tmp_path):
    """The logged val loss is x's, as the model's forward computes it on the same batches; y's
    (the trained params) differs; x is (y - (1 - b1) z) / b1 of the saved state; best/, the
    checkpoint's eval params and the run's meta are x."""
    workdir = tmp_path / "sf"
    _train(user_dir, workdir, "--config.optim.name=optax.contrib:schedule_free_adamw")
    config = _run_config(user_dir, ("optim.name", "optax.contrib:schedule_free_adamw"))
    x, meta = load_params(workdir)
    y, _ = load_params(workdir, trained=True)
    assert meta["eval_params"] == "schedule_free"
    cfg = GPTConfig(**meta["gpt_config"])
    batches = _val_batches(config, tmp_path / "data")
    logged = [r for r in read_metrics(workdir) if r["step"] == STEPS and "val_loss" in r][0]
    np.testing.assert_allclose(logged["val_loss"], _loss(x, cfg, batches), rtol=2e-5)
    y_loss = _loss(y, cfg, batches)
    assert abs(y_loss - logged["val_loss"]) > 1e-3
    # x from the schedule-free state's z, restored into the optimizer's own structure.
    tx, _ = make_optimizer(config.optim, config.num_steps)
    from minigpt_jax.runtime.checkpoint import Checkpointer
    from minigpt_jax.train.step import init_state

    target = jax.eval_shape(lambda: init_state(cfg, tx, jax.random.key(0)))
    checkpointer = Checkpointer(workdir)
    state, _ = checkpointer.restore(target)
    checkpointer.close()
    z = state.opt_state[1].z
    expected = jax.tree.map(lambda yi, zi: (yi - (1 - 0.9) * zi) / 0.9, y, z)
    chex.assert_trees_all_close(x, expected, rtol=1e-5, atol=1e-6)
    best, best_meta = load_params(workdir, "best")
    if best_meta["val_loss"] == logged["val_loss"]:
        chex.assert_trees_all_equal(best, x)
    np.testing.assert_allclose(best_meta["val_loss"], _loss(best, cfg, batches), rtol=2e-5)


def test_a_user_optimizer_with_a_hook_is_evaluated_through_it(user_dir, tmp_path):
    workdir = tmp_path / "sgd"
    _train(
        user_dir,
        workdir,
        "--config.optim.name=my_schedule_free:SGD",
        "--config.optim.schedule=constant",
        "--config.optim.lr=0.3",
    )
    x, meta = load_params(workdir)
    y, _ = load_params(workdir, trained=True)
    assert meta["eval_params"] == "my_schedule_free:SGD"
    config = _run_config(
        user_dir,
        ("optim.name", "my_schedule_free:SGD"),
        ("optim.schedule", "constant"),
        ("optim.lr", 0.3),
    )
    cfg = GPTConfig(**meta["gpt_config"])
    batches = _val_batches(config, tmp_path / "data")
    logged = [r for r in read_metrics(workdir) if r["step"] == STEPS and "val_loss" in r][0]
    np.testing.assert_allclose(logged["val_loss"], _loss(x, cfg, batches), rtol=2e-5)
    assert abs(_loss(y, cfg, batches) - logged["val_loss"]) > 1e-3


def test_ema_tracks_the_moving_average_of_the_params():
    """Two updates: ema = d2 (d1 p0 + (1 - d1) p1) + (1 - d2) p2, d_t = min(decay, (1+t)/(10+t))."""
    config = default_config()
    config.optim.eval_params, config.optim.ema_decay = "ema", 0.5
    parts = build_optimizer(config.optim, 100)
    params = {"w": jnp.ones((2, 3))}
    history = [params]
    # AdamW's decay mask reads each parameter's declared metadata (the model's modules declare
    # theirs): the toy parameter declares a decayed matrix.
    with param_meta.using({("w",): param_meta.ParamMeta(decay=True)}):
        state = parts.tx.init(params)
        for step in range(2):
            grads = {"w": jnp.full((2, 3), 0.1 * (step + 1))}
            updates, state = parts.tx.update(grads, state, history[-1])
            history.append(optax.apply_updates(history[-1], updates))
    name, select = parts.eval_params(state)
    d1, d2 = min(0.5, 2 / 11), min(0.5, 3 / 12)
    expected = d2 * (d1 * history[0]["w"] + (1 - d1) * history[1]["w"]) + (1 - d2) * history[2]["w"]
    assert name == "ema"
    np.testing.assert_allclose(select(state, history[-1])["w"], expected, rtol=1e-6)


def test_ema_is_evaluated_and_resumes_bit_exactly(user_dir, tmp_path):
    # A constant schedule: the first leg's num_steps then leaves the trajectory unchanged.
    flags = (
        "--config.optim.eval_params=ema",
        "--config.optim.ema_decay=0.9",
        "--config.optim.schedule=constant",
    )
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _train(user_dir, whole, *flags)
    _train(user_dir, resumed, *flags, f"--config.num_steps={STEPS // 2}")
    second = _train(user_dir, resumed, *flags)
    assert f"resumed from step {STEPS // 2}" in second.stdout

    def without_speed(records):
        return [{k: v for k, v in r.items() if k != "tokens_per_sec"} for r in records]

    assert without_speed(read_metrics(resumed)) == without_speed(read_metrics(whole))
    ema, meta = load_params(whole)
    assert meta["eval_params"] == "ema"
    chex.assert_trees_all_equal(ema, load_params(resumed)[0])
    trained = load_params(whole, trained=True)[0]
    chex.assert_trees_all_equal(trained, load_params(resumed, trained=True)[0])
    config = _run_config(
        user_dir,
        ("optim.eval_params", "ema"),
        ("optim.ema_decay", 0.9),
        ("optim.schedule", "constant"),
    )
    cfg = GPTConfig(**meta["gpt_config"])
    batches = _val_batches(config, tmp_path / "data")
    logged = [r for r in read_metrics(whole) if r["step"] == STEPS and "val_loss" in r][0]
    np.testing.assert_allclose(logged["val_loss"], _loss(ema, cfg, batches), rtol=2e-5)
    assert abs(_loss(trained, cfg, batches) - logged["val_loss"]) > 1e-4


# ----------------------------------------------------------------------------- metrics


def test_metrics_from_intermediates_are_logged_in_jsonl_and_tensorboard(user_dir, tmp_path):
    """Each metric's logged value at the last evaluation equals its independent computation
    from the run's params and the same val batches (attention weights from
    forward_with_attention, the table by hand)."""
    workdir = tmp_path / "metrics"
    spec = "attn_entropy,embed_norm,my_metrics:attn_max,my_metrics:FEATURES_RMS"
    _train(user_dir, workdir, f"--config.eval.metrics={spec}")
    names = ("attn_entropy", "embed_norm", "attn_max", "FEATURES_RMS")
    logged = [r for r in read_metrics(workdir) if "val_loss" in r]
    assert [r["step"] for r in logged] == [10, 20]
    for name in names:
        assert {f"val_{name}", f"eval_train_{name}"} <= set(logged[-1])
    scalars = tensorboard_scalars(workdir)
    for name in names:
        for prefix in ("val_", "eval_train_"):
            np.testing.assert_allclose(
                scalars[prefix + name][STEPS], logged[-1][prefix + name], rtol=1e-6
            )

    params, meta = load_params(workdir)
    cfg = GPTConfig(**meta["gpt_config"])
    batches = _val_batches(_run_config(user_dir, ("eval.metrics", spec)), tmp_path / "data")
    entropies, maxima = [], []
    for batch_BxT1 in batches:
        _, weights = forward_with_attention(params, jnp.asarray(batch_BxT1[:, :-1]), cfg)
        w0 = np.asarray(weights[0], np.float64)
        entropies.append(-(w0 * np.log(np.where(w0 > 0, w0, 1.0))).sum(-1).mean())
        maxima.append(np.mean([np.asarray(w).max(-1).mean() for w in weights]))
    table = np.asarray(params["embed"]["tok"]["embedding"][: cfg.vocab_size], np.float64)
    last = logged[-1]
    np.testing.assert_allclose(last["val_attn_entropy"], np.mean(entropies), rtol=1e-5)
    np.testing.assert_allclose(last["val_attn_max"], np.mean(maxima), rtol=1e-5)
    np.testing.assert_allclose(last["val_embed_norm"], np.sqrt((table**2).sum()), rtol=1e-5)
    assert 0 < last["val_attn_entropy"] < np.log(cfg.block_size)
    assert 0 < last["val_FEATURES_RMS"] < 10


def test_a_metric_breaking_its_contract_is_refused_before_training(user_dir, tmp_path):
    stderr = _refused(user_dir, tmp_path / "run", "--config.eval.metrics=broken:vector")
    assert "'broken:vector' returned an array of shape (3,)" in stderr
    assert "(params, batch_BxT1, intermediates, cfg) -> a float scalar" in stderr
    stderr = _refused(user_dir, tmp_path / "run", "--config.eval.metrics=attn_entropyy")
    assert "eval.metrics='attn_entropyy' is not a known metric" in stderr
    assert "did you mean 'attn_entropy'" in stderr


def test_unknown_eval_params_choice_is_refused():
    config = default_config()
    config.optim.eval_params = "emaa"
    with pytest.raises(RegistryError, match=r"optim.eval_params='emaa'.*did you mean 'ema'"):
        build_optimizer(config.optim, 10)
