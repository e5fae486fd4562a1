"""Sharding on 8 CPU devices: data parallel, FSDP and tensor parallel train like one device.

The device count is fixed when JAX starts, so the runs happen in one subprocess
(tests/sharding_worker.py) with XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ml_collections import ConfigDict

from minigpt_jax import sharding

pytestmark = pytest.mark.slow
WORKER = Path(__file__).with_name("sharding_worker.py")
MESHES = (
    "data8",
    "data2_fsdp4",
    "data2_fsdp2_tensor2",
    "data2_fsdp2_tensor2_direct_vjp",
    "data2_fsdp2_tensor2_accum2",
)


@pytest.fixture(scope="module")
def result():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run(
        [sys.executable, str(WORKER)], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_eight_devices_are_present(result):
    assert result["device_count"] == 8
    assert result["single"]["devices"] == 1
    assert all(result[name]["devices"] == 8 for name in MESHES)


@pytest.mark.parametrize("name", MESHES)
def test_sharded_losses_and_params_match_one_device(result, name):
    np.testing.assert_allclose(result[name]["losses"], result["single"]["losses"], rtol=1e-5)
    assert result[name]["max_param_diff"] < 1e-5


def test_data_parallel_replicates_params(result):
    run = result["data8"]
    assert run["qkv_spec"] == ["None"] * 4
    assert run["qkv_shard_shape"] == run["qkv_shape"] and run["qkv_devices"] == 8


def test_fsdp_really_shards_params_and_optimizer_state(result):
    run = result["data2_fsdp4"]
    assert run["qkv_spec"][0] == "fsdp"
    assert run["qkv_shard_shape"][0] * 4 == run["qkv_shape"][0]
    assert run["adam_mu_fc_shard_shape"] == [32, 128 // 4]  # fc kernel (D=32, F=128)


def test_tensor_parallel_splits_heads(result):
    run = result["data2_fsdp2_tensor2"]
    assert run["qkv_spec"] == ["fsdp", "None", "tensor", "None"]
    assert run["qkv_shard_shape"] == [16, 3, 1, 16]


def test_sharded_run_resumes_and_matches_one_device_end_to_end(result):
    np.testing.assert_allclose(
        result["e2e_losses"]["sharded"], result["e2e_losses"]["single"], rtol=1e-5
    )
    assert result["e2e_sharded_resumed_from"] == 4
    assert result["e2e_sharded_val_loss"] == pytest.approx(result["e2e_single_val_loss"], rel=1e-5)


@pytest.mark.parametrize(
    "sizes, message",
    [((3, 1, 1), "needs 3 devices but 1 are present"), ((-1, -1, 1), "at most one -1")],
)
def test_bad_mesh_is_named(sizes, message):
    with pytest.raises(ValueError, match=message):
        sharding.make_mesh(ConfigDict(dict(zip(sharding.MESH_AXES, sizes, strict=True))))


def test_batch_must_split_over_data_and_fsdp():
    mesh = sharding.make_mesh(ConfigDict(dict(data=1, fsdp=1, tensor=1)))
    sharding.check_batch_size(5, mesh)  # one device: anything goes
    with pytest.raises(ValueError, match="use a multiple of 8"):
        sharding.check_batch_size(12, type("M", (), {"shape": {"data": 2, "fsdp": 4}})())
