"""Device meshes and shardings: data parallelism, FSDP and tensor parallelism with jax.sharding.

A mesh has three axes. The batch is split over `data` × `fsdp`; every parameter (and its
optimizer moments) is split over `fsdp` along its largest divisible dimension (ZeRO-3 / FSDP);
`tensor` splits attention heads, the MLP's hidden units and the vocabulary (Megatron-style).
XLA inserts the collectives. On one device every sharding is trivial and costs nothing.

Multi-host: call `initialize_distributed()` first on every host (the CLI does); each host then
builds the same global batch from (seed, step) and places only its own rows.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Which dimension of a parameter the `tensor` axis splits, by the end of its path.
_TENSOR_DIM = {
    ("attn", "qkv", "kernel"): 2,  # (D, 3, H, K): heads
    ("attn", "qkv", "bias"): 1,  # (3, H, K)
    ("attn", "proj", "kernel"): 0,  # (H, K, D)
    ("mlp", "fc", "kernel"): 1,  # (D, F)
    ("mlp", "fc", "bias"): 0,  # (F,)
    ("mlp", "proj", "kernel"): 0,  # (F, D)
    ("tok", "embedding"): 0,  # (V, D): vocabulary
    ("lm_head", "kernel"): 1,  # (D, V)
}


HEARTBEAT_TIMEOUT_ENV = "MINIGPT_JAX_HEARTBEAT_TIMEOUT"


def initialize_distributed() -> bool:
    """Joins a multi-host run when the usual variables are set; returns whether it did.

    Set JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID
    on every host; on Cloud TPU or SLURM, MINIGPT_JAX_DISTRIBUTED=1 lets JAX detect them.
    MINIGPT_JAX_HEARTBEAT_TIMEOUT (seconds, JAX's default 100) bounds how long the others wait
    in a barrier for a process that died outside any collective before JAX ends them.
    """
    options = {}
    if os.environ.get(HEARTBEAT_TIMEOUT_ENV):
        options["heartbeat_timeout_seconds"] = int(os.environ[HEARTBEAT_TIMEOUT_ENV])
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize(
            coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
            **options,
        )
        return True
    if os.environ.get("MINIGPT_JAX_DISTRIBUTED") == "1":
        jax.distributed.initialize(**options)
        return True
    return False


@contextlib.contextmanager
def exit_when_a_process_is_lost(workdir: str) -> Iterator[None]:
    """In a multi-process run, turns a collective that fails because another process died into
    one clear message and an immediate exit (status 1).

    Without it the survivor prints an XLA traceback and then waits out jax.distributed's shutdown
    barrier (minutes) for the dead peer. The checkpoints already saved are complete (saves are
    synchronous), so rerunning every process resumes from the newest. When the coordinator
    (process 0) is the one that died, JAX itself aborts the others at once with "the JAX
    distributed service detected fatal errors ... another task died".
    """
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        if jax.process_count() == 1:
            raise
        detail = str(error).strip().splitlines()[0][:300]
        sys.stderr.write(
            f"minigpt-jax: error: process {jax.process_index()} of {jax.process_count()} lost "
            f"contact with another process of this run ({detail}). Another process probably "
            f"died: see its output. The checkpoints saved in {workdir} are kept; start every "
            "process again with the same command to resume from the newest.\n"
        )
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)  # skip the shutdown barrier, which would wait for the dead process


def make_mesh(mesh_config: Any, devices: list | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh; one size may be -1, meaning all remaining devices.

    In a single process, sizes that multiply to fewer than the devices present use the first
    ones (e.g. data=1 on an 8-device machine: one device); multi-host meshes use every device.
    """
    devices = jax.devices() if devices is None else devices
    sizes = [int(mesh_config[axis]) for axis in MESH_AXES]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(
            f"mesh sizes {_named(sizes)} are invalid: use positive sizes, "
            "with at most one -1 (all remaining devices)."
        )
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices do not split into mesh {_named(sizes)}.")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) < len(devices) and jax.process_count() == 1:
        devices = devices[: math.prod(sizes)]
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh {_named(sizes)} needs {math.prod(sizes)} devices but "
            f"{len(devices)} are present: make the sizes multiply to {len(devices)} "
            "(set one of them to -1 to fill)."
        )
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def _named(sizes) -> dict[str, int]:
    return dict(zip(MESH_AXES, sizes, strict=True))


def _names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def param_spec(path, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """The PartitionSpec of one parameter (or optimizer moment) from its path and shape;
    anything else in a train state (step, rng, optimizer counts) is replicated."""
    spec: list[Any] = [None] * len(shape)
    names = _names(path)
    if not names or names[-1] not in ("kernel", "bias", "embedding", "scale"):
        return PartitionSpec()
    tensor = mesh.shape["tensor"]
    for suffix, dim in _TENSOR_DIM.items():
        if names[-len(suffix) :] == suffix and tensor > 1 and shape[dim] % tensor == 0:
            spec[dim] = "tensor"
    fsdp = mesh.shape["fsdp"]
    if fsdp > 1:
        free = [d for d in range(len(shape)) if spec[d] is None and shape[d] % fsdp == 0]
        if free:
            spec[max(free, key=lambda d: shape[d])] = "fsdp"
    return PartitionSpec(*spec)


def tree_shardings(tree: Any, mesh: Mesh) -> Any:
    """NamedShardings for a params / train-state pytree (arrays or ShapeDtypeStructs)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, param_spec(path, x.shape, mesh)), tree
    )


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Arrays whose second-to-last axis is the batch, e.g. (B, T) or (K, B, T)."""
    return NamedSharding(mesh, PartitionSpec(*([None] * (ndim - 2)), BATCH_AXES, None))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % shards:
        raise ValueError(
            f"batch_size {batch_size} does not split over mesh data×fsdp = {shards} devices: "
            f"use a multiple of {shards}."
        )


def put_batch(batch: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """Places a host batch that every process holds whole; each device takes its own rows."""
    return jax.make_array_from_callback(batch.shape, sharding, lambda index: batch[index])
