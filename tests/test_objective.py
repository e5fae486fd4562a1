"""The objective seam and per-step metrics: a loss term of the model's internals adds exactly its
weighted value to the objective (its gradient equals the explicit sum's), and the per-step
metrics equal what they name, computed here by hand; through the command line from a folder
outside the package, every step logs them beside the cross-entropy."""

import json
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from minigpt_jax import GPTConfig
from minigpt_jax.model.blocks import Block
from minigpt_jax.model.gpt import GPT, init_params
from minigpt_jax.model.loss_terms import parse_terms
from minigpt_jax.train.step import init_state, loss_fn, train_step

CFG = GPTConfig(vocab_size=30, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
BATCH_BxT1 = jax.random.randint(jax.random.key(7), (4, 9), 0, CFG.vocab_size)


def explicit_activation_l2(params):
    """mean over blocks of mean(x²) of each Block's output, read with flax's own
    capture_intermediates (not the sow the term reads)."""
    _, state = GPT(CFG).apply(
        {"params": params},
        BATCH_BxT1[:, :-1],
        method=GPT.hidden,
        capture_intermediates=lambda module, method: isinstance(module, Block),
        mutable=["intermediates"],
    )
    outputs = [state["intermediates"][f"block_{i}"]["__call__"][0][0] for i in range(2)]
    return jnp.mean(jnp.stack([jnp.mean(jnp.square(x)) for x in outputs]))


def test_an_internal_terms_gradient_is_the_explicit_sums():
    params = init_params(CFG, jax.random.key(0))
    weight = 0.5
    terms = parse_terms(f"activation_l2={weight}")

    def objective(p):
        return loss_fn(p, BATCH_BxT1, CFG, train=False, terms=terms)[0]

    def explicit(p):
        return loss_fn(p, BATCH_BxT1, CFG, train=False)[0] + weight * explicit_activation_l2(p)

    value, aux = loss_fn(params, BATCH_BxT1, CFG, train=False, terms=terms)
    np.testing.assert_allclose(aux["activation_l2"], explicit_activation_l2(params), rtol=1e-6)
    np.testing.assert_allclose(value, explicit(params), rtol=1e-6)
    got, want = jax.grad(objective)(params), jax.grad(explicit)(params)
    # Two programs, summed in different orders: float32 rounding of the ~0.1 entries (2e-8
    # seen on an H200, where the order differs more than on a CPU).
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, want)
    # the term moves the gradient: without it, the embedding's gradient differs
    plain = jax.grad(lambda p: loss_fn(p, BATCH_BxT1, CFG, train=False)[0])(params)
    assert not np.allclose(plain["embed"]["tok"]["embedding"], got["embed"]["tok"]["embedding"])


def test_step_metrics_equal_the_norms_and_ratio_computed_by_hand():
    tx = optax.sgd(0.1)
    schedule = optax.constant_schedule(0.1)
    state = init_state(CFG, tx, jax.random.key(0))
    new_state, metrics = train_step(
        state,
        BATCH_BxT1,
        cfg=CFG,
        tx=tx,
        schedule=schedule,
        step_metrics=("grad_norm_by_tag", "update_ratio"),
    )
    grads = jax.grad(lambda p: loss_fn(p, BATCH_BxT1, CFG, train=True)[0])(state.params)
    groups = {"attention": [], "mlp": [], "embedding": [], "untagged": []}
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        names = [k.key for k in path]
        group = (
            "attention"
            if "attn" in names
            else "mlp"
            if "mlp" in names
            else "embedding"
            if "embed" in names
            else "untagged"  # the LayerNorms' scales and biases
        )
        groups[group].append(np.asarray(leaf, np.float64))
    for group, leaves in groups.items():
        expected = np.sqrt(sum((x**2).sum() for x in leaves))
        np.testing.assert_allclose(metrics[f"grad_norm_{group}"], expected, rtol=1e-5)
    change = jax.tree.map(lambda a, b: a - b, new_state.params, state.params)
    expected_ratio = optax.tree.norm(change) / optax.tree.norm(state.params)
    np.testing.assert_allclose(metrics["update_ratio"], expected_ratio, rtol=1e-4)


def test_a_step_metric_that_reuses_a_logged_name_is_refused():
    from minigpt_jax.settings.registry import RegistryError
    from minigpt_jax.train.step_metrics import STEP_METRICS, step_metric_values

    with pytest.raises(RegistryError, match="logs 'update_ratio', which the step or another"):
        step_metric_values(
            ("update_ratio",), {}, {"w": jnp.ones(2)}, {"w": jnp.ones(2)}, {"update_ratio"}
        )
    # A key of the run's record is refused even where no other value holds it yet.
    STEP_METRICS.register("gn", lambda grads, updates, params: {"grad_norm": jnp.float32(0)})
    try:
        with pytest.raises(RegistryError, match="'gn': it logs 'grad_norm', a key the run's"):
            step_metric_values(("gn",), {}, {}, {}, set())
    finally:
        STEP_METRICS._entries.pop("gn")


@pytest.mark.slow
def test_the_command_line_logs_internal_terms_and_step_metrics_every_step(tmp_path, corpus_file):
    """docs/extending/losses.md's my_aux.py from a folder of its own: its term reaches the objective
    (train_loss = cross_entropy + 0.01 · mlp_l1 every step) beside the built-in activation_l2,
    and the step metrics are in every step's record."""
    from helpers import extending_files, train_args

    source = extending_files()["my_aux.py"]
    (tmp_path / "my_aux.py").write_text(source)
    workdir = tmp_path / "run"
    args = train_args(
        workdir,
        corpus_file,
        "--config.model.mlp=my_aux:SowingMLP",
        "--config.loss.terms=my_aux:mlp_l1=0.01,activation_l2=0.001",
        "--config.step_metrics=grad_norm_by_tag,update_ratio",
        "--config.num_steps=4",
        "--config.eval_every=4",
        "--config.checkpoint_every=4",
    )
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        objective = r["cross_entropy"] + 0.01 * r["mlp_l1"] + 0.001 * r["activation_l2"]
        assert r["train_loss"] == pytest.approx(objective, rel=1e-6)
        assert r["mlp_l1"] > 0 and r["activation_l2"] > 0
        assert {"grad_norm_attention", "grad_norm_mlp", "update_ratio"} <= set(r)
    assert "val_mlp_l1" in records[-1]
