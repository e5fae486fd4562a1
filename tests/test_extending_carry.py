"""State between layers (issue 52, item 4): docs/extending/model.md's value residual, one user
file in a folder outside the package, passes the first layer's values to every later layer
through the block's carry, its attention built from MultiHeadAttention's public parts. With
every λ at 1 it is the built-in block; the KV cache decodes as the full forward; remat leaves
the loss and its gradients as they are; through the command line it trains under remat and
samples."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    THREE_TINY_STEPS,
    cli_in,
    decoded_one_token_at_a_time,
    extending_files,
    write_module,
)

from minigpt_jax import GPTConfig
from minigpt_jax.model.blocks import BLOCKS
from minigpt_jax.model.gpt import forward, init_params
from minigpt_jax.settings.registry import RegistryError
from minigpt_jax.train.step import loss_fn

VOCAB = 40
TOKENS_BxT = jax.random.randint(jax.random.key(7), (2, 12), 0, VOCAB)


@pytest.fixture
def carry_dir(user_dir, monkeypatch):
    (user_dir / "my_value_residual.py").write_text(extending_files()["my_value_residual.py"])
    monkeypatch.syspath_prepend(str(user_dir))
    return user_dir


@pytest.fixture
def CFG(carry_dir):  # noqa: N802 (the module's config, once its plug-in is importable)
    return GPTConfig(
        vocab_size=VOCAB, block_size=16, n_layer=3, n_head=4, n_embd=32, dropout=0.0,
        block="my_value_residual:ValueResidualBlock",
    )  # fmt: skip


def _without_value_mix(params):
    return {
        name: {**layer, "attn": {k: v for k, v in layer["attn"].items() if k != "value_mix"}}
        if name.startswith("block_")
        else layer
        for name, layer in params.items()
    }


def test_every_lambda_at_1_is_the_built_in_block(carry_dir, CFG):
    params = init_params(CFG, jax.random.key(0))
    assert "value_mix" not in params["block_0"]["attn"]  # the first layer's values are v1
    assert all(float(params[f"block_{i}"]["attn"]["value_mix"]) == 0.5 for i in (1, 2))
    built_in_cfg, built_in_params = CFG.replace(block="pre_ln"), _without_value_mix(params)
    ones = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.ones_like(x) if path[-1].key == "value_mix" else x, params
    )
    built_in = forward(built_in_params, TOKENS_BxT, built_in_cfg)
    np.testing.assert_allclose(forward(ones, TOKENS_BxT, CFG), built_in, rtol=1e-6, atol=1e-6)
    # at λ = 0.5 the first layer's values reach the later layers: another output
    assert float(jnp.abs(forward(params, TOKENS_BxT, CFG) - built_in).max()) > 1e-3


@pytest.mark.parametrize("pos_encoding", ["learned", "rope"])
def test_the_cache_decodes_as_the_full_forward_with_remat_on(carry_dir, CFG, pos_encoding):
    cfg = CFG.replace(pos_encoding=pos_encoding, remat="full")
    params = init_params(cfg, jax.random.key(1))
    full_BxTxV = forward(params, TOKENS_BxT, cfg)
    decoded_BxTxV = decoded_one_token_at_a_time(params, TOKENS_BxT, cfg)
    np.testing.assert_allclose(decoded_BxTxV, full_BxTxV, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_keeps_the_loss_and_its_gradients(carry_dir, CFG, remat):
    params = init_params(CFG, jax.random.key(2))
    tokens_BxT1 = jax.random.randint(jax.random.key(8), (2, 13), 0, VOCAB)

    def value_and_grad(cfg):
        return jax.value_and_grad(loss_fn, has_aux=True)(params, tokens_BxT1, cfg, train=False)

    (plain, _), plain_grads = value_and_grad(CFG)
    (value, _), grads = value_and_grad(CFG.replace(remat=remat))
    np.testing.assert_allclose(value, plain, rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grads, plain_grads
    )
    assert float(jnp.abs(grads["block_2"]["attn"]["value_mix"])) > 0  # λ learns


def test_a_block_that_takes_a_carry_and_returns_none_is_named(carry_dir, CFG):
    write_module(
        carry_dir,
        "my_bad_carry.py",
        """
        import flax.linen as nn
        from minigpt_jax.model.blocks import BLOCKS


        class Forgets(nn.Module):
            cfg: object

            @nn.compact
            def __call__(self, x, positions, deterministic=True, cache=None, carry=None):
                inner = BLOCKS["pre_ln"](self.cfg, name="inner")
                return inner(x, positions, deterministic, cache)
        """,
    )
    returned = r"returned tuple of 2 values, not \(x_BxTxD, cache, carry\)"
    with pytest.raises(RegistryError, match=returned):
        BLOCKS.check_contract("my_bad_carry:Forgets", CFG.replace(block="pre_ln"))


@pytest.mark.slow
def test_the_command_line_trains_under_remat_and_samples(carry_dir):
    cli_in(
        carry_dir,
        *THREE_TINY_STEPS,
        "--config.model.block=my_value_residual:ValueResidualBlock",
        "--config.model.remat=full",
    )
    sampled = cli_in(
        carry_dir, "sample", "--workdir", "run", "--prompt", "The ", "--max_new_tokens", "8"
    )
    assert sampled.stdout.startswith("The ")
