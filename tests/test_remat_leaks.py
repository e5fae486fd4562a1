"""A plug-in that breaks `model.remat` (issue 52, item 6): a block that keeps layer 0's output
in a module-level global, which jax.checkpoint's trace of each block lets escape. In process
and through the command line, the raw UnexpectedTracerError becomes one header naming the
plug-in's module:attr and remat, the line of the user's code that made the escaped value, and
the fix; without remat the same plug-in trains."""

import jax
import pytest
from helpers import cli_in, write_module

from minigpt_jax import GPTConfig, init_params
from minigpt_jax.settings.registry import PluginError

LEAKY = """
    import flax.linen as nn

    from minigpt_jax.model.blocks import Block

    FIRST = {}  # layer 0's output, read by the later layers: state outside the blocks' calls


    class Leaky(nn.Module):
        cfg: object

        @nn.compact
        def __call__(self, x_BxTxD, positions_BxT, deterministic=True, cache=None):
            out, cache = Block(self.cfg, name="inner")(x_BxTxD, positions_BxT, deterministic, cache)
            if self.name == "block_0" or "x" not in FIRST:
                FIRST["x"] = out
            return out + 0.5 * FIRST["x"], cache
    """


@pytest.fixture
def leaky_dir(user_dir, monkeypatch):
    write_module(user_dir, "my_leaky.py", LEAKY)
    monkeypatch.syspath_prepend(str(user_dir))
    return user_dir


def test_a_leak_under_remat_names_the_plugin_and_the_fix(leaky_dir):
    cfg = GPTConfig(
        vocab_size=30, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
        block="my_leaky:Leaky", remat="full",
    )  # fmt: skip
    with pytest.raises(PluginError) as caught:
        init_params(cfg, jax.random.key(0))
    header, made, fix = str(caught.value).splitlines()
    assert header.startswith(
        "error in user code of model.block='my_leaky:Leaky': UnexpectedTracerError under "
        "model.remat='full': a value kept outside a block's call (a module-level global"
    )
    assert made.startswith(f"  the escaped value was made at {leaky_dir / 'my_leaky.py'}:14")
    assert "--config.model.remat=none" in fix
    assert isinstance(caught.value.__cause__, jax.errors.UnexpectedTracerError)
    init_params(cfg.replace(remat="none"), jax.random.key(0))  # one trace: it works


def _train(folder, *extra, check=True):
    return cli_in(
        folder, "train", "--config", "tiny", "--workdir", "run",
        "--config.data.corpus=text", "--config.data.path=corpus.txt", "--progress=false",
        "--config.num_steps=2", "--config.optim.warmup_steps=0",
        "--config.model.block=my_leaky:Leaky", *extra, check=check,
    )  # fmt: skip


@pytest.mark.slow
def test_train_with_remat_and_a_leaking_plugin_ends_in_its_header(leaky_dir):
    result = _train(leaky_dir, "--config.model.remat=full", check=False)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("minigpt-jax train")]
    assert lines == [
        "minigpt-jax train: error in user code of model.block='my_leaky:Leaky': "
        "UnexpectedTracerError under model.remat='full': a value kept outside a block's call "
        "(a module-level global, a class attribute) escaped the trace jax.checkpoint makes of "
        "each block"
    ]
    assert "Traceback" not in result.stderr
    assert "Fix: pass the value through the block's inputs and outputs" in result.stderr
