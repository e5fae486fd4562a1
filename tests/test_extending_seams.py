"""The module seams from a researcher's own files: docs/extending/'s gated MLP, block,
attention score and kernel, written into a folder outside the package, train through the
command line; each parameter's metadata (Muon group, sharding rule) comes from its creation
site, a matrix declaring none is refused naming its path, and a kernel that cannot apply a
score is refused naming model.attention=explicit."""

import re
import subprocess
import sys
import types
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import extending_files, pydoc_text, train_args
from jax.sharding import PartitionSpec

from minigpt_jax import GPTConfig, forward, init_params, sharding
from minigpt_jax.model.gpt import GPT, init_annotated_params
from minigpt_jax.model.param_meta import UndeclaredParameterError
from minigpt_jax.model.variants import attention as variants
from minigpt_jax.muon import muon_dimension_numbers
from minigpt_jax.optimizers import decay_mask
from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.train.metrics import read_metrics

# The full suite only (`python -m pytest -q`): plug-ins trained through the CLI.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SEAM_FILES = {"my_mlp.py", "my_blocks.py", "my_scores.py", "my_kernels.py"}

# A user MLP whose matrix declares nothing: refused, naming the parameter's path.
UNDECLARED_MLP = """
import flax.linen as nn


class Plain(nn.Module):
    cfg: object

    @nn.compact
    def __call__(self, x_BxTxD, *, deterministic=True):
        h_BxTxF = nn.gelu(nn.Dense(self.cfg.mlp_dim, name="wide")(x_BxTxD))
        return nn.Dense(self.cfg.n_embd, name="narrow")(h_BxTxF)
"""


def doc_files() -> dict[str, str]:
    return extending_files()


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """A folder outside the package holding the docs' files, importable as top-level modules."""
    folder = tmp_path_factory.mktemp("user_seams")
    for name, source in doc_files().items():
        folder.joinpath(name).write_text(source)
    folder.joinpath("my_plain_mlp.py").write_text(UNDECLARED_MLP)
    (folder / "corpus.txt").write_text(pydoc_text())
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def _train(user_dir, workdir, *extra, ok=True):
    args = train_args(
        workdir,
        user_dir / "corpus.txt",
        "--config.num_steps=4",
        "--config.eval_every=4",
        "--config.checkpoint_every=4",
        *extra,
    )
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=user_dir)
    if ok:
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        assert result.returncode != 0, result.stdout[-2000:]
    return result


def test_the_docs_hold_the_seam_examples():
    assert SEAM_FILES <= set(doc_files())


CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
TENSOR_2 = types.SimpleNamespace(shape={"data": 1, "fsdp": 1, "tensor": 2})  # param_spec reads


def _tokens_BxT(length=12):
    return jax.random.randint(jax.random.key(3), (2, length), 0, CFG.vocab_size)


# ----------------------------------------------------------------------------- through the CLI


@pytest.mark.slow
def test_gated_mlp_parallel_block_and_alibi_train_through_the_cli(user_dir, tmp_path):
    """The docs' SwiGLU, parallel block and ALiBi (its own max_bias setting overridden) at once,
    under Muon: the run trains, records the plug-ins and the setting, and its gate matrix is
    in Muon's group, decayed, with F split over the tensor axis."""
    workdir = tmp_path / "run"
    _train(
        user_dir,
        workdir,
        "--config.model.mlp=my_mlp:SwiGLU",
        "--config.model.mlp_ratio=2.6667",
        "--config.model.mlp_multiple=8",
        "--config.model.block=my_blocks:Parallel",
        "--config.model.attention_score=my_scores:alibi",
        "--config.model.max_bias=4",
        "--config.model.pos_encoding=none",
        "--config.optim.name=muon",
    )
    params, meta = load_params(workdir)
    stored = meta["gpt_config"]
    assert (stored["mlp"], stored["block"]) == ("my_mlp:SwiGLU", "my_blocks:Parallel")
    assert stored["attention_score"] == "my_scores:alibi"
    assert dict(map(tuple, stored["entry_settings"]))["max_bias"] == 4
    cfg = GPTConfig(**stored)
    n_embd = cfg.n_embd
    width = -(-round(2.6667 * n_embd) // 8) * 8
    mlp = params["block_0"]["mlp"]
    assert mlp["gate"]["kernel"].shape == mlp["up"]["kernel"].shape == (n_embd, width)
    assert "ln_2" not in params["block_0"] and "ln" in params["block_0"]  # the user's block
    assert all(np.isfinite(r["train_loss"]) for r in read_metrics(workdir) if "train_loss" in r)

    init_params(cfg, jax.random.key(0))  # records the model's declarations, as training does
    dims = muon_dimension_numbers(params)["block_0"]["mlp"]
    expected = optax.contrib.MuonDimensionNumbers(reduction_axis=0, output_axis=1)
    assert dims["gate"]["kernel"] == dims["up"]["kernel"] == expected
    assert decay_mask(params)["block_0"]["mlp"]["gate"]["kernel"]
    annotated = jax.eval_shape(lambda: init_annotated_params(cfg, jax.random.key(0)))
    specs = sharding.param_specs(annotated, TENSOR_2)
    assert specs["block_0", "mlp", "gate", "kernel"][1] == PartitionSpec(None, "tensor")
    assert specs["block_0", "mlp", "proj", "kernel"][1] == PartitionSpec("tensor", None)


@pytest.mark.slow
def test_user_kernel_by_module_attr_trains(user_dir, tmp_path):
    _train(
        user_dir,
        tmp_path / "run",
        "--config.model.attention=my_kernels:KERNEL",
        "--config.model.dropout=0",
    )
    assert load_params(tmp_path / "run")[1]["gpt_config"]["attention"] == "my_kernels:KERNEL"


def test_a_matrix_no_rule_covers_is_refused_naming_its_path(user_dir, tmp_path):
    """Refused before training (the MLP registry's contract), naming the parameter's path,
    the config key and what to declare."""
    result = _train(user_dir, tmp_path / "run", "--config.model.mlp=my_plain_mlp:Plain", ok=False)
    assert re.search(r"block_0/mlp/(narrow|wide)/kernel", result.stderr), result.stderr[-2000:]
    assert "param_meta.declare" in result.stderr and "model.mlp" in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("kernel", ["xla", "my_kernels:KERNEL"])
def test_a_kernel_that_skips_scores_is_refused(user_dir, tmp_path, kernel):
    result = _train(
        user_dir,
        tmp_path / "run",
        f"--config.model.attention={kernel}",
        "--config.model.dropout=0",
        "--config.model.attention_score=alibi",
        ok=False,
    )
    assert "model.attention=explicit" in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


# ----------------------------------------------------------------------------- what each computes


def test_user_mlp_has_its_own_gate_and_computes_swiglu(user_dir):
    """proj(silu(x·W_gate) ⊙ x·W_up) in NumPy from the user MLP's own parameters; it equals
    the built-in `swiglu`, parameter for parameter."""
    from my_mlp import SwiGLU

    cfg = CFG.replace(mlp_ratio=8 / 3, mlp_multiple=8)
    x_BxTxD = jax.random.normal(jax.random.key(1), (2, 5, cfg.n_embd))
    variables = nn.unbox(SwiGLU(cfg).init(jax.random.key(0), x_BxTxD))
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
    assert p["gate"]["kernel"].shape == (32, 88)  # round(85.33) = 85 -> 88
    assert not np.allclose(p["gate"]["kernel"], p["up"]["kernel"])  # two matrices, two inits
    x = np.asarray(x_BxTxD, np.float64)
    gate = x @ p["gate"]["kernel"] + p["gate"]["bias"]
    up = x @ p["up"]["kernel"] + p["up"]["bias"]
    expected = (gate / (1 + np.exp(-gate)) * up) @ p["proj"]["kernel"] + p["proj"]["bias"]
    out = SwiGLU(cfg).apply(variables, x_BxTxD)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    from minigpt_jax.model.blocks import MLPS

    np.testing.assert_allclose(MLPS["swiglu"](cfg).apply(variables, x_BxTxD), out, rtol=1e-6)


def test_user_block_is_the_parallel_block(user_dir):
    """The docs' block computes what the built-in `parallel` does, its norm named `ln`, in
    evaluation and with dropout (the attention branch's included)."""
    user = CFG.replace(block="my_blocks:Parallel")
    params = init_params(user, jax.random.key(0))
    builtin = {
        name: (
            {("ln_1" if key == "ln" else key): value for key, value in p.items()}
            if name.startswith("block_")
            else p
        )
        for name, p in params.items()
    }
    tokens_BxT = _tokens_BxT()
    np.testing.assert_allclose(
        forward(params, tokens_BxT, user),
        forward(builtin, tokens_BxT, CFG.replace(block="parallel")),
        rtol=1e-5,
        atol=1e-6,
    )
    # with dropout on, the same key drops the same units of both branches (issue 52)
    dropped, key = CFG.replace(dropout=0.5), jax.random.key(3)
    user_BxTxV = forward(
        params, tokens_BxT, dropped.replace(block="my_blocks:Parallel"), train=True, rng=key
    )
    builtin_BxTxV = forward(builtin, tokens_BxT, dropped.replace(block="parallel"),
                            train=True, rng=key)  # fmt: skip
    np.testing.assert_allclose(user_BxTxV, builtin_BxTxV, rtol=1e-5, atol=1e-6)
    assert not np.allclose(user_BxTxV, forward(params, tokens_BxT, user), atol=1e-3)


def test_user_alibi_equals_the_builtin_slopes(user_dir):
    """For H a power of two the docs' ALiBi is the built-in one; max_bias scales the slopes."""
    from my_scores import alibi

    scores_BxHxTxS = jax.random.normal(jax.random.key(2), (2, 4, 5, 7))
    q_BxT = jnp.tile(jnp.arange(2, 7)[None], (2, 1))
    k_BxS = jnp.tile(jnp.arange(7)[None], (2, 1))
    cfg = CFG.replace(attention_score="my_scores:alibi")
    np.testing.assert_allclose(
        alibi(scores_BxHxTxS, q_BxT, k_BxS, cfg),
        variants.alibi(scores_BxHxTxS, q_BxT, k_BxS, CFG.replace(attention_score="alibi")),
        rtol=1e-6,
    )
    gentle = cfg.replace(entry_settings=(("max_bias", 4.0),))
    bias = np.asarray(alibi(0 * scores_BxHxTxS, q_BxT, k_BxS, gentle))
    np.testing.assert_allclose(bias[0, 0, 0, 0], -(2.0**-1) * 2, rtol=1e-6)  # m_1 = 2^(-4/4)


def test_user_kernel_computes_attention(user_dir):
    cfg = CFG.replace(attention="my_kernels:KERNEL")
    params = init_params(cfg, jax.random.key(0))
    tokens_BxT = _tokens_BxT()
    np.testing.assert_allclose(
        forward(params, tokens_BxT, cfg),
        forward(params, tokens_BxT, cfg.replace(attention="explicit")),
        rtol=1e-5,
        atol=1e-5,
    )


def test_undeclared_matrix_raises_at_init(user_dir):
    cfg = CFG.replace(mlp="my_plain_mlp:Plain")
    undeclared = r"block_0/mlp/(narrow|wide)/kernel .*declare"
    with pytest.raises(UndeclaredParameterError, match=undeclared):
        init_params(cfg, jax.random.key(0))
    # The same module's flax init works: the refusal is the metadata's, not flax's.
    assert GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
