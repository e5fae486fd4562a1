"""The memory budget: what the devices and the host can still hold, what a piece of work needs
(a text encoded in RAM, a training run from its shapes, XLA's account of a compiled program),
and the refusals that compare the two before anything is allocated. The data (a corpus read
into RAM), `eval` (a text), the training loop and sampling (batches planned to fit) ask here.
It imports nothing of the package: a model's figures come in as arguments."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.sharding import Mesh

if TYPE_CHECKING:  # the type only: budget imports nothing of the model when it runs
    from minigpt_jax.model.config import GPTConfig

# ----------------------------------------------------------------------------- what there is


# Where the kernel says what this process's memory cgroup may use (Docker --memory, SLURM
# --mem, a Kubernetes limit): the cgroup v2 tree, or v1's memory hierarchy under it.
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_SELF_CGROUP = "/proc/self/cgroup"
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def host_memory() -> tuple[int | None, str]:
    """(bytes of RAM this process can still get, what bounds it): the host's MemAvailable, or
    less where the process's memory cgroup sets a limit (`cgroup_memory_available`); None if
    neither says."""
    host = _mem_available()
    limited = cgroup_memory_available()
    if limited is not None and (host is None or limited[0] < host):
        return limited
    return host, "host RAM"


def host_memory_available() -> int | None:
    """Bytes of RAM this process can still get (`host_memory`), None if unknown."""
    return host_memory()[0]


def _mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_memory_available(
    root: str = CGROUP_ROOT, proc_self_cgroup: str = PROC_SELF_CGROUP
) -> tuple[int, str] | None:
    """(bytes, where) the tightest memory cgroup limit of this process still allows, over its
    cgroup and every ancestor: limit - usage, the usage without the inactive file cache the
    kernel reclaims before it kills (as `docker stats` counts it). cgroup v2 (memory.max,
    memory.current) or v1 (memory.limit_in_bytes, memory.usage_in_bytes); None where no limit
    is set or the files cannot be read."""
    try:
        with open(proc_self_cgroup, encoding="ascii") as file:
            lines = file.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one tree for every controller
            found += _limits(Path(root), path, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):  # v1: the memory hierarchy
            v1 = Path(root) / "memory"
            found += _limits(
                v1, path, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
            )
    return min(found, default=None)


def _limits(
    mount: Path, path: str, limit_file: str, usage_file: str, inactive_key: str
) -> list[tuple[int, str]]:
    """[(limit - usage + inactive file cache, where)] of each cgroup from `path` up to `mount`
    that sets a limit. A path not found under the mount (a container that sees only its own
    cgroup, mounted at the root) is read from the mount itself."""
    parts = [part for part in path.strip("/").split("/") if part]
    if not (mount.joinpath(*parts)).is_dir():
        parts = []
    found = []
    for depth in range(len(parts), -1, -1):
        directory = mount.joinpath(*parts[:depth])
        try:
            limit = (directory / limit_file).read_text().strip()
            if limit == "max" or int(limit) >= _NO_LIMIT:
                continue
            usage = int((directory / usage_file).read_text())
        except (OSError, ValueError):
            continue
        inactive = 0
        try:
            for line in (directory / "memory.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    inactive = int(value)
        except (OSError, ValueError):
            pass
        where = f"the memory cgroup's limit ({directory / limit_file}: {format_bytes(int(limit))})"
        found.append((max(int(limit) - usage + inactive, 0), where))
    return found


def free_memory() -> tuple[int | None, str]:
    """(bytes, where): what the default device can still allocate (bytes_limit - bytes_in_use),
    or the host's available RAM for a CPU; None when the backend does not say."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return host_memory()
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "bytes_limit" not in stats:
        return None, str(device)
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), f"{device} memory"


def on_cpu(mesh: Mesh) -> bool:
    """Whether the mesh's devices are CPU devices (which share the host's RAM)."""
    return all(d.platform == "cpu" for d in mesh.devices.flat)


def memory_available(mesh: Mesh) -> int | None:
    """Bytes the mesh's devices can hold in all: the sum of each accelerator's limit, or the
    host's free RAM for CPU devices (which share it); None if unknown."""
    if on_cpu(mesh):
        return host_memory_available()
    limits = _memory_limits(list(mesh.devices.flat))
    return None if limits is None else sum(limits)


def memory_per_device(mesh: Mesh) -> tuple[int, int] | None:
    """(bytes one device may hold, devices sharing that figure) for this process's devices of
    the mesh: each accelerator's limit (the smallest), shared by 1; or the host's free RAM,
    shared by every local CPU device. None if unknown."""
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    if on_cpu(mesh):
        free = host_memory_available()
        return None if free is None else (free, len(local))
    limits = _memory_limits(local)
    return None if limits is None else (min(limits), 1)


def _memory_limits(devices) -> list[int] | None:
    """Each accelerator's bytes_limit, None if one does not say."""
    limits = []
    for device in devices:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if not stats or "bytes_limit" not in stats:
            return None
        limits.append(int(stats["bytes_limit"]))
    return limits


def format_bytes(n: int | float) -> str:
    """'1.5 GiB', '312 KiB': n bytes in the largest binary unit that keeps a number >= 1."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------- a text in RAM

# RAM a text takes per byte while it is read, its tokenizer built and the text encoded in one
# call (benchmarks/corpus_memory.py, peak RSS over the RSS after the imports: char 26.0 bytes a
# byte at 16, 64, 128 and 256 MB, byte-level BPE 89.3 and 89.7 at 16 and 64 MB; a little over).
TEXT_BYTES_PER_BYTE = {"bpe": 95, "char": 27}


def text_shortfall(text_bytes: int, tokenizer_kind: str) -> tuple[int, int] | None:
    """(bytes needed, bytes available) when encoding `text_bytes` of text in RAM at once with
    a `tokenizer_kind` tokenizer would not fit in the host's free RAM; None when it fits (or
    the free RAM is unknown)."""
    available = host_memory_available()
    needed = text_bytes * TEXT_BYTES_PER_BYTE.get(tokenizer_kind, TEXT_BYTES_PER_BYTE["bpe"])
    if available is None or needed <= available:
        return None
    return needed, available


def text_bytes_that_fit(available: int, tokenizer_kind: str) -> int:
    """How many bytes of text `available` bytes of RAM encode at once."""
    return available // TEXT_BYTES_PER_BYTE.get(tokenizer_kind, TEXT_BYTES_PER_BYTE["bpe"])


# ----------------------------------------------------------------------------- a training run


def train_bytes_lower_bound(
    cfg: GPTConfig,
    state_shapes: Any,
    micro_batch_size: int,
    batches_shape: tuple[int, int, int],
    *,
    fused_attention: bool,
) -> int:
    """A lower bound on the bytes a run of model `cfg` holds at once, from shapes
    only (nothing allocated): the train state (`state_shapes`, its jax.eval_shape), the batches
    of one call (batches_shape: (steps_per_call, batch_size, block_size + 1) int32), one
    micro-batch's float32 logits with their gradient (a chunk of them with loss_chunk), and
    what the backward pass keeps of every layer: its input (the residual stream, even with
    remat) and, unless model.remat is "full", its MLP hidden activations (F per token, which
    the second matmul's gradient reads) and, without a fused attention kernel, its attention
    weights (H x T x T per sequence). Everything else the activations take comes on top."""
    state_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(state_shapes))
    tokens = micro_batch_size * cfg.block_size
    itemsize = np.dtype(cfg.dtype).itemsize
    logits_bytes = 2 * 4 * min(tokens, cfg.loss_chunk or tokens) * cfg.padded_vocab_size
    kept_per_token = cfg.n_embd
    if cfg.remat != "full":
        kept_per_token += cfg.mlp_dim
        if not fused_attention:
            kept_per_token += cfg.n_head * cfg.block_size
    layers_bytes = cfg.n_layer * tokens * kept_per_token * itemsize
    return state_bytes + 4 * int(np.prod(batches_shape)) + logits_bytes + layers_bytes


def check_train_fits(needed: int, mesh: Mesh) -> None:
    """Refuses, before any array is allocated, a run whose lower bound (`train_bytes_lower_bound`)
    exceeds what the mesh's devices can hold."""
    available = memory_available(mesh)
    if available is not None and needed > available:
        raise ValueError(
            f"this run needs at least {needed / 2**30:.1f} GiB (train state, one call's "
            f"batches, one micro-batch's logits and what its backward pass keeps of each "
            f"layer) but the devices have {available / 2**30:.1f} GiB available; use a smaller "
            "model (n_layer, n_embd), a smaller batch_size or steps_per_call, or more "
            "grad_accum_steps."
        )


def compiled_bytes(compiled: jax.stages.Compiled) -> tuple[int, int] | None:
    """(bytes one device holds while `compiled` runs, of which its arguments): XLA's own
    account of a compiled program (arguments, outputs not aliased to donated arguments,
    temporaries, code). None where the backend gives no account."""
    try:
        stats = compiled.memory_analysis()
    except (NotImplementedError, RuntimeError, AttributeError):
        return None
    if stats is None:
        return None
    outputs = max(stats.output_size_in_bytes - stats.alias_size_in_bytes, 0)
    total = (
        stats.argument_size_in_bytes
        + outputs
        + stats.temp_size_in_bytes
        + stats.generated_code_size_in_bytes
    )
    return total, stats.argument_size_in_bytes


def check_compiled_fits(compiled: jax.stages.Compiled, mesh: Mesh) -> None:
    """Refuses, before its first call, a compiled train step that XLA's account says will not
    fit on the mesh's devices (the shape-based lower bound misses the activations'
    temporaries)."""
    account, room = compiled_bytes(compiled), memory_per_device(mesh)
    if account is None or room is None:
        return
    (total, arguments), (available, sharing) = account, room
    cpu = on_cpu(mesh)
    # CPU devices share the host's free RAM, which already holds the state and batches.
    needed = (total - arguments) * sharing if cpu else total
    if needed > available:
        where = "the host has" if cpu else "each device has"
        raise ValueError(
            f"the compiled train step needs {needed / 2**30:,.1f} GiB (XLA's account: "
            f"{total / 2**30:,.1f} GiB per device, arguments included) but {where} "
            f"{available / 2**30:,.1f} GiB available, so nothing was trained; use a smaller "
            "batch_size or steps_per_call, more grad_accum_steps, model.remat=full, or a "
            "smaller model (n_layer, n_embd), then rerun."
        )
