"""Open parameter metadata: every parameter may carry tags (the built-in embedding, attention,
mlp and head, or a plug-in's own, declared where it is created), and `optim.lr_multipliers`
scales the updates of a tag's parameters and no others."""

import sys

import jax
import ml_collections
import numpy as np
import pytest

from minigpt_jax import GPTConfig
from minigpt_jax.model.gpt import init_params
from minigpt_jax.model.param_meta import tags_of
from minigpt_jax.optimizers import make_optimizer
from minigpt_jax.settings.groups import Optim, check_values, defaults
from minigpt_jax.train.step import init_state, train_step

CFG = GPTConfig(vocab_size=30, block_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.0)
BATCH_BxT1 = jax.random.randint(jax.random.key(7), (4, 9), 0, CFG.vocab_size)


def one_step_change(multipliers: str, name: str = "optax:sgd") -> dict:
    """{path: (params after step 1 - before, tags)} at a constant rate (step 0's rate is the
    warmup's 0, so the second step is the one measured)."""
    optim = ml_collections.ConfigDict(
        {**defaults(Optim), "name": name, "schedule": "constant", "warmup_steps": 0}
    )
    optim.lr_multipliers = multipliers
    tx, schedule = make_optimizer(optim, 10)
    state = init_state(CFG, tx, jax.random.key(0))
    state, _ = train_step(state, BATCH_BxT1, cfg=CFG, tx=tx, schedule=schedule)
    new_state, _ = train_step(state, BATCH_BxT1, cfg=CFG, tx=tx, schedule=schedule)
    flat_new = jax.tree_util.tree_leaves_with_path(new_state.params)
    flat_old = jax.tree_util.tree_leaves(state.params)
    return {
        "/".join(str(k.key) for k in path): (np.asarray(new) - np.asarray(old), tags_of(path, new))
        for (path, new), old in zip(flat_new, flat_old, strict=True)
    }


def test_a_factor_scales_exactly_its_groups_updates():
    plain, doubled = one_step_change(""), one_step_change("embedding=2")
    assert {tags for _, tags in plain.values()} == {(), ("attention",), ("mlp",), ("embedding",)}
    for path, (change, tags) in doubled.items():
        base = plain[path][0]
        assert np.abs(base).max() > 1e-8, path  # every parameter moved in this step
        if tags == ("embedding",):  # SGD's update x 2, up to the rounding of params + update
            np.testing.assert_allclose(change, 2 * base, rtol=0, atol=1e-8, err_msg=path)
            assert np.linalg.norm(change) / np.linalg.norm(base) == pytest.approx(2, rel=1e-3)
        else:
            np.testing.assert_array_equal(change, base, err_msg=path)


def test_factor_zero_freezes_its_group_under_adamw_decay_included():
    changes = one_step_change("mlp=0", name="adamw")
    for path, (change, tags) in changes.items():
        if tags == ("mlp",):
            assert not change.any(), path
        else:
            assert change.any(), path


def test_a_tag_no_parameter_declares_is_refused_naming_the_tags():
    with pytest.raises(ValueError) as error:
        one_step_change("mpl=0")
    assert str(error.value) == (
        "optim.lr_multipliers names ['mpl'], which no parameter declares; the parameters' "
        "tags: ['attention', 'embedding', 'mlp'] (param_meta.declare(tags=...))."
    )


@pytest.mark.parametrize("text", ["mlp", "mlp=-1", "=2", "mlp=inf"])
def test_a_malformed_multiplier_is_one_line_before_anything_runs(text):
    with pytest.raises(ValueError, match=r"is not tag=factor .*e\.g\. 'embedding=10,head=0\.5'"):
        check_values(Optim, {"lr_multipliers": text}, "config.optim")


GATED = """
import flax.linen as nn

from minigpt_jax.model.param_meta import declare


class TaggedGate(nn.Module):
    cfg: object

    @nn.compact
    def __call__(self, x_BxTxD, *, deterministic=True):
        def dense(width, name, tags=()):
            init = declare(nn.initializers.normal(0.02), muon=(0, 1), decay=True, tags=tags)
            return nn.Dense(width, kernel_init=init, name=name)

        gate_BxTxF = nn.relu(dense(self.cfg.mlp_dim, "gate", ("my_gate",))(x_BxTxD))
        up_BxTxF = dense(self.cfg.mlp_dim, "up")(x_BxTxD)
        return dense(self.cfg.n_embd, "proj")(gate_BxTxF * up_BxTxF)
"""


@pytest.mark.slow
def test_a_plugins_own_tag_freezes_only_its_parameter_through_the_cli(tmp_path, corpus_file):
    """A user MLP tags its gate "my_gate"; lr_multipliers=my_gate=0 leaves exactly the gate at
    its initial value (the run's init: key(seed 0) split, as `train` draws it)."""
    import os

    from helpers import run, train_args

    from minigpt_jax.model_files import load_model

    (tmp_path / "my_gated.py").write_text(GATED)
    workdir = tmp_path / "run"
    settings = [
        "--config.model.mlp=my_gated:TaggedGate",
        "--config.optim.lr_multipliers=my_gate=0",
        "--config.num_steps=4",
        "--config.checkpoint_every=4",
        "--config.eval_every=4",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    result = run(train_args(workdir, corpus_file, *settings), env=env)
    assert result.returncode == 0, result.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        model = load_model(workdir)
        init_rng, _ = jax.random.split(jax.random.key(0))
        initial = init_params(model.cfg, init_rng)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_gated", None)
    for layer in ("block_0", "block_1"):
        trained, first = model.params[layer]["mlp"], initial[layer]["mlp"]
        # `train` initialises under jit, which may round the init's last bit differently from
        # this eager init_params; one update moves a weight by ~1e-3, far above 1e-7.
        np.testing.assert_allclose(trained["gate"]["kernel"], first["gate"]["kernel"], atol=1e-7)
        assert np.abs(trained["up"]["kernel"] - first["up"]["kernel"]).max() > 1e-4
        assert np.abs(trained["gate"]["bias"] - first["gate"]["bias"]).max() > 1e-4  # untagged
