"""Run by tests/test_sharding.py in a process with 8 CPU devices; prints one JSON result.

Trains the tiny model on 1 device and on several 8-device meshes from the same init and the
same batches, and reports losses, parameter differences and the shardings it saw.
"""

import json
import os
import sys
import tempfile

assert "xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "float32")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import tiny  # noqa: E402
from minigpt_jax import sharding  # noqa: E402
from minigpt_jax.config_dict import gpt_config_from  # noqa: E402
from minigpt_jax.optimizers import make_optimizer  # noqa: E402
from minigpt_jax.runtime import compile_cache  # noqa: E402
from minigpt_jax.train.loop import train_and_evaluate  # noqa: E402
from minigpt_jax.train.metrics import read_metrics  # noqa: E402
from minigpt_jax.train.step import make_init_state, make_train_chunk  # noqa: E402
from minigpt_jax.typed_config import build_experiment  # noqa: E402

MESHES = {
    "single": (1, 1, 1),
    "data8": (8, 1, 1),
    "data2_fsdp4": (2, 4, 1),
    "data2_fsdp2_tensor2": (2, 2, 2),
    # GPTConfig.dense_grad="direct" with params sharded over fsdp and heads over tensor
    "data2_fsdp2_tensor2_direct_vjp": (2, 2, 2),
    # grad_accum_steps=2: micro-batches of 4 rows, each split over data × fsdp
    "data2_fsdp2_tensor2_accum2": (2, 2, 2),
}


def mesh_config(sizes):
    return ConfigDict(dict(zip(sharding.MESH_AXES, sizes, strict=True)))


def low_level(result):
    config = tiny.get_config()
    # float32 matmuls on every CPU: the claim is float32 equivalence (with bf16 operands, the
    # next layer's rounding magnifies summation-order differences to bf16's own tolerance).
    cfg = gpt_config_from(config, vocab_size=64).replace(matmul_dtype="float32")
    tx, schedule = make_optimizer(config.optim, 20)
    batches = np.random.default_rng(0).integers(0, 64, (5, 8, cfg.block_size + 1)).astype(np.int32)
    params = {}
    for name, sizes in MESHES.items():
        run_cfg = cfg.replace(dense_grad="direct") if name.endswith("direct_vjp") else cfg
        mesh = sharding.make_mesh(mesh_config(sizes))
        state = make_init_state(run_cfg, tx, mesh)(jax.random.key(0))
        accum = 2 if name.endswith("accum2") else 1
        step = make_train_chunk(run_cfg, tx, schedule, mesh, grad_accum_steps=accum)
        state, metrics = step(state, sharding.put_batch(batches, sharding.batch_sharding(mesh, 3)))
        qkv = state.params["block_0"]["attn"]["qkv"]["kernel"]
        mu = state.opt_state[1][0].mu["block_0"]["mlp"]["fc"]["kernel"]
        result[name] = {
            "devices": int(mesh.devices.size),
            "losses": [float(x) for x in metrics["loss"]],
            "qkv_spec": [str(a) for a in qkv.sharding.spec],
            "qkv_shard_shape": list(qkv.addressable_shards[0].data.shape),
            "qkv_shape": list(qkv.shape),
            "qkv_devices": len(qkv.sharding.device_set),
            "adam_mu_fc_shard_shape": list(mu.addressable_shards[0].data.shape),
        }
        params[name] = jax.device_get(state.params)
    for name in MESHES:
        diffs = jax.tree_util.tree_map(
            lambda a, b: float(np.abs(a - b).max()), params[name], params["single"]
        )
        result[name]["max_param_diff"] = max(jax.tree_util.tree_leaves(diffs))


def end_to_end(result):
    """train_and_evaluate on 1 device and on data2 × fsdp4, the sharded one stopped and resumed."""
    corpus = os.path.join(tempfile.mkdtemp(), "corpus.txt")
    from pydoc_data.topics import topics

    with open(corpus, "w") as f:
        f.write("\n\n".join(topics[k] for k in sorted(topics))[:40_000])
    losses = {}
    for name, sizes, stops in (("single", (1, 1, 1), [None]), ("sharded", (2, 4, 1), [4, None])):
        config = tiny.get_config()
        config.batch_size, config.num_steps, config.eval_batches = 8, 8, 1
        config.eval_every = config.checkpoint_every = 4
        config.data.corpus, config.data.path = "text", corpus
        config.mesh = mesh_config(sizes)
        workdir = tempfile.mkdtemp()
        for stop in stops:
            summary = train_and_evaluate(
                build_experiment(config), workdir, progress=False, stop_at=stop
            )
        losses[name] = [r["train_loss"] for r in read_metrics(workdir) if "train_loss" in r]
        result[f"e2e_{name}_val_loss"] = summary.val_loss
        result[f"e2e_{name}_resumed_from"] = summary.resumed_from
    result["e2e_losses"] = losses


if __name__ == "__main__":
    # The suite's cache (conftest.py): the resumed sharded run loads the programs its first leg
    # compiled, as a resumed `minigpt-jax train` does; the numbers do not change.
    compile_cache.enable()
    out = {"device_count": jax.device_count()}
    low_level(out)
    end_to_end(out)
    print("RESULT " + json.dumps(out))
