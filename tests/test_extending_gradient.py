"""The training step's gradient seam (issue 52, item 2): docs/extending/optimizers.md's SAM, one
user file in a folder outside the package, picked by config.optim.gradient. Its one compiled
step equals a two-gradient step written here by hand (same params, same batch, the same
optimizer), and through the command line it trains, evaluates, checkpoints and resumes: a run
stopped at step 2 and resumed logs what an uninterrupted run logs."""

import json

import jax
import numpy as np
import optax
import pytest
from helpers import cli_in, extending_files

from minigpt_jax import GPTConfig, forward
from minigpt_jax.optimizers import build_optimizer
from minigpt_jax.settings.groups import Optim
from minigpt_jax.train.gradients import GRADIENTS, plain, step_gradient
from minigpt_jax.train.step import init_state, make_train_chunk

# float32 matmuls: "auto" trains with bf16 operands on CPUs with a bf16 dot unit, while the
# hand-written step below differentiates the float32 forward.
CFG = GPTConfig(
    vocab_size=30,
    block_size=8,
    n_layer=2,
    n_head=2,
    n_embd=16,
    dropout=0.0,
    matmul_dtype="float32",
)
RHO = 0.1


@pytest.fixture
def sam_dir(user_dir, monkeypatch):
    (user_dir / "my_sam.py").write_text(extending_files()["my_sam.py"])
    monkeypatch.syspath_prepend(str(user_dir))
    return user_dir


def mean_cross_entropy(params, tokens_BxT1):
    logits_BxTxV = forward(params, tokens_BxT1[:, :-1], CFG)
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, tokens_BxT1[:, 1:]).mean()


def test_sams_step_is_the_hand_written_two_gradient_step(sam_dir):
    # SGD: the update is the gradient scaled, so the check sees every entry of it (Adam's first
    # step is near sign(g), where the two gradients mostly agree).
    optim = Optim(
        name="optax:sgd",
        lr=0.5,
        warmup_steps=0,
        gradient="my_sam:sam",
        entry_settings=(("sam_rho", RHO),),
    )
    parts = build_optimizer(optim, num_steps=10)
    state = init_state(CFG, parts.tx, jax.random.key(0))
    tokens_BxT1 = jax.random.randint(jax.random.key(5), (4, 9), 0, CFG.vocab_size)
    step = make_train_chunk(
        CFG, parts.tx, parts.schedule, gradient=step_gradient(optim), donate=False
    )
    new_state, metrics = step(state, tokens_BxT1[None])

    # By hand: g at params, the point params + rho·g/|g|, the gradient there, one optimizer update.
    params = state.params
    grads = jax.grad(mean_cross_entropy)(params, tokens_BxT1)
    norm = np.sqrt(sum(float(np.sum(np.square(g))) for g in jax.tree.leaves(grads)))
    moved = jax.tree.map(lambda p, g: p + RHO / norm * g, params, grads)
    sharp_grads = jax.grad(mean_cross_entropy)(moved, tokens_BxT1)
    updates, _ = parts.tx.update(sharp_grads, state.opt_state, params)
    want = optax.apply_updates(params, updates)

    np.testing.assert_allclose(metrics["loss"][0], mean_cross_entropy(params, tokens_BxT1), 1e-6)
    np.testing.assert_allclose(metrics["grad_norm"][0], optax.tree.norm(sharp_grads), 1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), new_state.params, want
    )
    # the one-gradient step lands elsewhere
    plain_updates, _ = parts.tx.update(grads, state.opt_state, params)
    plain_leaves = jax.tree.leaves(optax.apply_updates(params, plain_updates))
    sam_leaves = jax.tree.leaves(new_state.params)
    assert not all(np.allclose(a, b) for a, b in zip(plain_leaves, sam_leaves, strict=True))


def test_the_default_rule_is_the_plain_step_itself():
    """Nothing picked: the step calls `plain`, which is value_and_grad at the params."""
    assert step_gradient(Optim()) is plain
    assert GRADIENTS.names() == ["plain"]


def _train(folder, workdir, num_steps):
    cli_in(
        folder, "train", "--config", "tiny", "--workdir", workdir,
        "--config.data.corpus=text", "--config.data.path=corpus.txt", "--progress=false",
        f"--config.num_steps={num_steps}", "--config.eval_every=2",
        "--config.checkpoint_every=2", "--config.optim.schedule=constant",
        "--config.optim.warmup_steps=0", "--config.optim.gradient=my_sam:sam",
        f"--config.optim.sam_rho={RHO}",
    )  # fmt: skip
    lines = (folder / workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_sam_trains_evaluates_and_resumes_through_the_command_line(sam_dir):
    whole = _train(sam_dir, "whole", 4)
    _train(sam_dir, "resumed", 2)
    resumed = _train(sam_dir, "resumed", 4)

    def losses(records):
        return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}

    assert sorted(losses(whole)) == [1, 2, 3, 4]
    assert losses(resumed) == losses(whole)  # the resumed steps are bit-identical
    vals = {r["step"]: r["val_loss"] for r in whole if "val_loss" in r}
    assert sorted(vals) == [2, 4]
    assert {r["step"]: r["val_loss"] for r in resumed if "val_loss" in r} == vals
    assert (sam_dir / "resumed" / "checkpoints").is_dir()
