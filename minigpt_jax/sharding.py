"""Device meshes and shardings: data parallelism, FSDP and tensor parallelism with jax.sharding.

A mesh has three axes. The batch is split over `data` × `fsdp`; every parameter (and its
optimizer moments) is split over `fsdp` along its largest divisible dimension (ZeRO-3 / FSDP);
`tensor` splits attention heads, the MLP's hidden units and the vocabulary (Megatron-style).
XLA inserts the collectives. On one device every sharding is trivial and costs nothing.

Which dimension `tensor` splits is declared where the parameter is created, with
`nn.with_partitioning(init, (None, "tensor"))`, so renaming a layer keeps its rule; the model's
`init_annotated_params` returns those boxed declarations and `tree_shardings` reads them.

Multi-host: call `initialize_distributed()` first on every host (the CLI does); each host then
builds the same global batch from (seed, step) and places only its own rows.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

if TYPE_CHECKING:  # the group's type only
    from minigpt_jax.settings.groups import Mesh as MeshSettings

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

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


def make_mesh(mesh_config: MeshSettings, devices: list | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh; one size may be -1, meaning all remaining devices.

    In a single process, sizes that multiply to fewer than the devices present use the first
    ones (e.g. data=1 on an 8-device machine: one device); multi-host meshes use every device.
    """
    devices = jax.devices() if devices is None else devices
    sizes = [int(getattr(mesh_config, axis)) for axis in MESH_AXES]
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


def param_spec(declared: tuple, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """The PartitionSpec of one parameter of `shape` whose creation site declared the mesh axes
    `declared` (one entry per dimension, None for none).

    A declared axis is kept where it divides its dimension (else that dimension is replicated);
    then `fsdp` splits the largest remaining dimension it divides.
    """
    if len(declared) != len(shape):
        raise ValueError(f"mesh axes {declared} do not match a parameter of shape {shape}.")
    spec: list[Any] = [None] * len(shape)
    for dim, axis in enumerate(declared):
        if axis is None:
            continue
        if axis not in MESH_AXES:
            raise ValueError(
                f"a parameter of shape {shape} declares mesh axes {declared}, but {axis!r} is not "
                f"one of the mesh's axes {MESH_AXES}."
            )
        if mesh.shape[axis] > 1 and shape[dim] % mesh.shape[axis] == 0:
            spec[dim] = axis
    fsdp = mesh.shape["fsdp"]
    if fsdp > 1 and "fsdp" not in spec:
        free = [d for d in range(len(shape)) if spec[d] is None and shape[d] % fsdp == 0]
        if free:
            spec[max(free, key=lambda d: shape[d])] = "fsdp"
    return PartitionSpec(*spec)


def param_specs(annotated_params: Any, mesh: Mesh) -> dict[tuple[str, ...], tuple]:
    """{parameter path: (shape, PartitionSpec)} from params (arrays or ShapeDtypeStructs) whose
    annotated leaves are boxed in `nn.Partitioned`, e.g. `jax.eval_shape` of the model's
    `init_annotated_params`; a leaf without a box declares no axis."""
    boxed = jax.tree_util.tree_flatten_with_path(
        annotated_params, is_leaf=lambda x: isinstance(x, nn.Partitioned)
    )[0]
    specs = {}
    for path, leaf in boxed:
        if isinstance(leaf, nn.Partitioned):
            declared, leaf = tuple(leaf.names), leaf.value
        else:
            declared = (None,) * len(leaf.shape)
        shape = tuple(leaf.shape)
        specs[_names(path)] = (shape, param_spec(declared, shape, mesh))
    return specs


def tree_specs(tree: Any, mesh: Mesh, annotated_params: Any) -> Any:
    """PartitionSpecs for a params / train-state pytree (arrays or ShapeDtypeStructs).

    A leaf whose path ends with a parameter's path and that has its shape (the parameter
    itself, AdamW's moments mu and nu) takes the parameter's spec (`param_specs` of
    `annotated_params`); anything else (step, rng, optimizer counts) is replicated.
    """
    specs = param_specs(annotated_params, mesh)

    def spec(path, x) -> PartitionSpec:
        names = _names(path)
        for start in range(len(names)):  # the longest parameter path that ends this one
            shape_spec = specs.get(names[start:])
            if shape_spec is not None and shape_spec[0] == tuple(x.shape):
                return shape_spec[1]
        return PartitionSpec()

    return jax.tree_util.tree_map_with_path(spec, tree)


def tree_shardings(tree: Any, mesh: Mesh, annotated_params: Any) -> Any:
    """NamedShardings on `mesh` for a params / train-state pytree: `tree_specs`."""
    return jax.tree_util.tree_map(
        lambda spec: NamedSharding(mesh, spec),
        tree_specs(tree, mesh, annotated_params),
        is_leaf=lambda x: isinstance(x, PartitionSpec),
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
    return jax.make_array_from_callback(batch.shape, sharding, batch.__getitem__)
