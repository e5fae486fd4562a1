"""Sharding on 8 CPU devices: data parallel, FSDP and tensor parallel train like one device.

The device count is fixed when JAX starts, so the runs happen in one subprocess
(tests/sharding_worker.py) with XLA_FLAGS=--xla_force_host_platform_device_count=8. The
partition rules themselves are checked on abstract meshes, which need no devices.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec
from ml_collections import ConfigDict

from configs import tiny
from minigpt_jax import optimizers, sharding
from minigpt_jax.model import param_meta
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import init_annotated_params, init_params
from minigpt_jax.train import step

WORKER = Path(__file__).with_name("sharding_worker.py")
MESHES = (
    "data8",
    "data2_fsdp4",
    "data2_fsdp2_tensor2",
    "data2_fsdp2_tensor2_direct_vjp",
    "data2_fsdp2_tensor2_accum2",
)

# The full suite only (`python -m pytest -q`): eight fake devices in a subprocess.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run(
        [sys.executable, str(WORKER)], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.slow
def test_eight_devices_are_present(result):
    assert result["device_count"] == 8
    assert result["single"]["devices"] == 1
    assert all(result[name]["devices"] == 8 for name in MESHES)


@pytest.mark.slow
@pytest.mark.parametrize("name", MESHES)
def test_sharded_losses_and_params_match_one_device(result, name):
    np.testing.assert_allclose(result[name]["losses"], result["single"]["losses"], rtol=1e-5)
    assert result[name]["max_param_diff"] < 1e-5


@pytest.mark.slow
def test_data_parallel_replicates_params(result):
    run = result["data8"]
    assert run["qkv_spec"] == ["None"] * 4
    assert run["qkv_shard_shape"] == run["qkv_shape"] and run["qkv_devices"] == 8


@pytest.mark.slow
def test_fsdp_really_shards_params_and_optimizer_state(result):
    run = result["data2_fsdp4"]
    assert run["qkv_spec"][0] == "fsdp"
    assert run["qkv_shard_shape"][0] * 4 == run["qkv_shape"][0]
    assert run["adam_mu_fc_shard_shape"] == [32, 128 // 4]  # fc kernel (D=32, F=128)


@pytest.mark.slow
def test_tensor_parallel_splits_heads(result):
    run = result["data2_fsdp2_tensor2"]
    assert run["qkv_spec"] == ["fsdp", "None", "tensor", "None"]
    assert run["qkv_shard_shape"] == [16, 3, 1, 16]


@pytest.mark.slow
def test_sharded_run_resumes_and_matches_one_device_end_to_end(result):
    np.testing.assert_allclose(
        result["e2e_losses"]["sharded"], result["e2e_losses"]["single"], rtol=1e-5
    )
    assert result["e2e_sharded_resumed_from"] == 4
    assert result["e2e_sharded_val_loss"] == pytest.approx(result["e2e_single_val_loss"], rel=1e-5)


def test_bad_mesh_is_named():
    count = len(jax.devices())
    for sizes, message in [
        ((count + 1, 1, 1), f"needs {count + 1} devices but {count} are present"),
        ((-1, -1, 1), "at most one -1"),
    ]:
        with pytest.raises(ValueError, match=message):
            sharding.make_mesh(ConfigDict(dict(zip(sharding.MESH_AXES, sizes, strict=True))))


def test_batch_must_split_over_data_and_fsdp():
    mesh = sharding.make_mesh(ConfigDict(dict(data=1, fsdp=1, tensor=1)))
    sharding.check_batch_size(5, mesh)  # one device: anything goes
    with pytest.raises(ValueError, match="use a multiple of 8"):
        sharding.check_batch_size(12, type("M", (), {"shape": {"data": 2, "fsdp": 4}})())


# ----------------------------------------------------------------------------- partition rules

# The rules as a table keyed on path suffixes, before each moved beside its parameter (kept
# here as the expected values): which dimension the `tensor` axis splits.
TENSOR_DIM_BEFORE = {
    ("attn", "qkv", "kernel"): 2,  # (D, 3, H, K): heads
    ("attn", "qkv", "bias"): 1,  # (3, H, K)
    ("attn", "proj", "kernel"): 0,  # (H, K, D)
    ("mlp", "fc", "kernel"): 1,  # (D, F)
    ("mlp", "fc", "bias"): 0,  # (F,)
    ("mlp", "proj", "kernel"): 0,  # (F, D)
    ("tok", "embedding"): 0,  # (V, D): vocabulary
    ("lm_head", "kernel"): 1,  # (D, V)
}
# Untied (so lm_head exists), biases on, the vocabulary padded to split in two.
UNTIED = GPTConfig(
    vocab_size=65,
    block_size=16,
    n_layer=2,
    n_head=4,
    n_embd=32,
    tie_embeddings=False,
    vocab_multiple=8,
)
KEY = jax.random.key(0)


def _mesh(data=1, fsdp=1, tensor=1):
    return AbstractMesh((data, fsdp, tensor), sharding.MESH_AXES)


def _names(path):
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _state_specs(cfg, mesh):
    """{leaf path: PartitionSpec} of the whole AdamW train state of `cfg` on `mesh`."""
    tx, _ = optimizers.make_optimizer(tiny.get_config().optim, 10)
    shardings = step.state_shardings(cfg, tx, mesh)
    flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
    return {_names(path): s.spec for path, s in flat}


def _tensor_dim_before(names):
    for suffix, dim in TENSOR_DIM_BEFORE.items():
        if names[-len(suffix) :] == suffix:
            return dim
    return None


def test_every_tensor_rule_of_the_model_is_found():
    """On a tensor=2 mesh each parameter, and its AdamW mu and nu, is split where the table
    said; everything else in the state is replicated."""
    specs = _state_specs(UNTIED, _mesh(tensor=2))
    param_paths = [
        _names(p) for p, _ in jax.tree_util.tree_flatten_with_path(init_params(UNTIED, KEY))[0]
    ]
    assert len([p for p in param_paths if _tensor_dim_before(p) is not None]) == 2 * 6 + 2
    for names, spec in specs.items():
        if names[0] == "params" or "mu" in names or "nu" in names:
            param = next(p for p in param_paths if names[-len(p) :] == p)
            expected = [None] * len(spec)
            if _tensor_dim_before(param) is not None:
                expected[_tensor_dim_before(param)] = "tensor"
            assert tuple(spec) == tuple(expected), names
        else:
            assert spec == PartitionSpec(), names
    moments = [n for n in specs if "mu" in n or "nu" in n]
    assert len(moments) == 2 * len(param_paths)


def test_fsdp_takes_the_largest_free_divisible_dim_beside_tensor():
    specs = _state_specs(UNTIED, _mesh(fsdp=2, tensor=2))
    qkv = ("block_0", "attn", "qkv", "kernel")  # (D=32, 3, H=4, K=8)
    assert specs[("params", *qkv)] == PartitionSpec("fsdp", None, "tensor", None)
    assert specs[("params", "embed", "tok", "embedding")] == PartitionSpec("tensor", "fsdp")
    assert specs[("params", "ln_f", "scale")] == PartitionSpec("fsdp")
    mu_qkv = next(spec for names, spec in specs.items() if "mu" in names and names[-4:] == qkv)
    assert mu_qkv == specs[("params", *qkv)]


def test_a_tensor_rule_that_does_not_divide_falls_back_to_replicated():
    cfg = UNTIED.replace(vocab_multiple=1)  # V = 65 rows: odd
    specs = _state_specs(cfg, _mesh(tensor=8))  # 4 heads, F = 128, V = 65
    qkv = specs[("params", "block_0", "attn", "qkv", "kernel")]
    assert qkv == PartitionSpec(None, None, None, None)
    assert specs[("params", "block_0", "mlp", "fc", "kernel")] == PartitionSpec(None, "tensor")
    assert specs[("params", "embed", "tok", "embedding")] == PartitionSpec(None, None)


class _Renamed(nn.Module):
    """A Dense under a name no table has heard of, its rule (and optimizer metadata, which the
    optimizer reads) declared where it is created."""

    @nn.compact
    def __call__(self, x):
        init = param_meta.declare(nn.initializers.normal(0.02), (None, "tensor"), decay=True)
        h = nn.Dense(8, kernel_init=init, name="a_brand_new_name")(x)
        plain = param_meta.declare(nn.initializers.normal(0.02), decay=True)
        return nn.Dense(4, kernel_init=plain, name="plain")(h)


def test_a_renamed_parameter_keeps_its_rule():
    annotated = jax.eval_shape(_Renamed().init, KEY, jnp.zeros((1, 6)))["params"]
    param_meta.record(annotated)
    params = nn.unbox(annotated)
    tx, _ = optimizers.make_optimizer(tiny.get_config().optim, 10)
    state = {"params": params, "opt_state": jax.eval_shape(tx.init, params)}
    specs = sharding.tree_specs(state, _mesh(tensor=2), annotated)
    assert specs["params"]["a_brand_new_name"]["kernel"] == PartitionSpec(None, "tensor")
    assert specs["params"]["plain"]["kernel"] == PartitionSpec(None, None)
    adam = specs["opt_state"][1][0]  # chain(clip, adamw(scale_by_adam, ...))
    assert adam.mu["a_brand_new_name"]["kernel"] == PartitionSpec(None, "tensor")
    assert adam.nu["a_brand_new_name"]["kernel"] == PartitionSpec(None, "tensor")
    assert adam.count == PartitionSpec()


def test_an_axis_the_mesh_lacks_is_named():
    annotated = {"layer": {"kernel": nn.Partitioned(jnp.zeros((4, 4)), (None, "tensr"))}}
    with pytest.raises(ValueError, match="'tensr' is not one of the mesh's axes"):
        sharding.param_specs(annotated, _mesh(tensor=2))


def test_init_params_returns_plain_arrays_and_the_annotations_match_them():
    params = init_params(UNTIED, KEY)
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(params))
    assert params["embed"]["tok"]["embedding"].shape == (72, 32)
    annotated = init_annotated_params(UNTIED, KEY)
    equal = jax.tree_util.tree_map(np.array_equal, nn.unbox(annotated), params)
    assert all(jax.tree_util.tree_leaves(equal))
