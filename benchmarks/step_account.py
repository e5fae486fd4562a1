"""Where a training step's time goes on the CPU: a per-op account of minigpt-jax's compiled step
(XLA's profile) beside the same account of its PyTorch twin (torch.profiler), in one run.

Run:      python -m benchmarks.step_account [--config shakespeare_char] [--steps 20]
              [--data DIR | --synthetic] [--threads N] [--no-torch] [--clock-ghz 3.6]
Needs:    the `bench` extra (torch); the corpus as benchmarks/train_throughput.py does.
Measures: both sides train the config's model on the same batches (train_throughput's columns:
          the compiled chunk of K steps, the eager twin with the JAX init), warmed up, then
          --steps steps under the profiler. XLA CPU records every thunk it runs (a fusion, a
          dot, a copy) on the thread that ran it; each is put in a category by its HLO: a dot
          (or a fusion holding one) is a matmul, else the flax module in its op_name decides
          (attn: the mask and softmax; mlp: the activation; ln_: the norms; embed and the
          read-out's take: embedding and loss), and an op outside the model's jvp is the
          optimizer's (the update, clipping, the schedule, Muon's Newton-Schulz matmuls).
          torch ops are put in the same categories by name (aten::mm, _softmax,
          native_layer_norm, gelu, ...; anything under Optimizer.step or the clipping is the
          optimizer's), by their self time. XLA runs
          independent thunks on all threads at once, so a category's milliseconds are its share
          of the busy time times the wall time per step (torch: its share of the ops' self
          time, likewise); "host" is the wall time no op accounts for.
Prints:   the machine (benchmarks/machine.py); then per category ms/step and share for each
          side (the torch column is left out, with a line naming what the twin lacks, for a
          config it does not mirror, e.g. the speedrun's), and the matmuls' time at the CPU's
          float32 peak (the model's dot FLOP per step, minigpt_jax.flops_per_token, over the
          peak). Run it alone on the cores.
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import tempfile
import time
from typing import Any

MATMUL, ATTENTION, ACTIVATION, NORMS = "matmuls", "attention softmax*", "activation", "norms"
EMBED_LOSS, OPTIMIZER, OTHER, HOST = "embedding+loss", "optimizer update", "other", "host"
CATEGORIES = (MATMUL, ATTENTION, ACTIVATION, NORMS, EMBED_LOSS, OPTIMIZER, OTHER, HOST)


# ----------------------------------------------------------------------------- XLA's side


def hlo_instructions(hlo_text: str) -> dict[str, tuple[str, bool]]:
    """{instruction name: (its op_name metadata, whether it is or calls a dot)} of the compiled
    module's text, for every instruction a thunk may be named after."""
    computations: dict[str, list[str]] = {}
    current = None
    for line in hlo_text.splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header and not line.startswith(" "):
            current = header.group(1)
            computations[current] = []
        elif current is not None:
            computations[current].append(line)
    has_dot: dict[str, bool] = {}

    def calls_dot(name: str, seen: frozenset = frozenset()) -> bool:
        if name not in has_dot:
            lines = computations.get(name, [])
            called = [c for line in lines for c in re.findall(r"calls=%?([\w.\-]+)", line)]
            has_dot[name] = any(re.search(r"\s(dot|convolution)\(", line) for line in lines) or any(
                calls_dot(c, seen | {name}) for c in called if c not in seen
            )
        return has_dot[name]

    found = {}
    for lines in computations.values():
        for line in lines:
            match = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = \S+ (\w[\w\-]*)\(", line)
            if not match:
                continue
            name, opcode = match.groups()
            op_name = re.search(r'op_name="([^"]*)"', line)
            called = re.findall(r"calls=%?([\w.\-]+)", line)
            dot = opcode in ("dot", "convolution") or any(calls_dot(c) for c in called)
            found[name] = (op_name.group(1) if op_name else "", dot)
    return found


def xla_category(op_name: str, dot: bool) -> str:
    """The category of an HLO instruction from its op_name (the jaxpr path, with flax's module
    names) and whether it is a matmul."""
    in_model = "jvp(" in op_name
    if dot:  # the model's matmuls; an optimizer's own (Muon's Newton-Schulz) are its update's
        return MATMUL if in_model or not op_name else OPTIMIZER
    if "/attn" in op_name:
        return ATTENTION
    if "/mlp" in op_name:
        return ACTIVATION
    if re.search(r"/ln_(\d|f)", op_name):
        return NORMS
    if "/embed" in op_name or "take_along_axis" in op_name or "log_softmax" in op_name:
        return EMBED_LOSS
    if not in_model and op_name:
        return OPTIMIZER
    return OTHER


def xla_busy_ms(xplane_path: str, instructions: dict[str, tuple[str, bool]]) -> dict[str, float]:
    """Busy milliseconds per category, summed over XLA's threads, from one profile."""
    from jax.profiler import ProfileData

    busy: dict[str, float] = collections.defaultdict(float)
    for plane in ProfileData.from_file(xplane_path).planes:
        for line in plane.lines:
            if not line.name.startswith(("tf_XLAEigen", "tf_XLAPjRtCpuClient")):
                continue
            for event in line.events:
                if event.name in instructions:
                    busy[xla_category(*instructions[event.name])] += event.duration_ns / 1e6
    return dict(busy)


def xla_account(
    config: Any, batches: Any, vocab_size: int, steps: int
) -> tuple[dict[str, float], float]:
    """(busy ms per category over the profiled steps, wall ms per step)."""
    import jax

    from benchmarks.train_throughput import compiled_chunk

    k = config.steps_per_call
    train_chunk, state, chunks, _ = compiled_chunk(config, vocab_size, batches)
    for chunk in chunks[:2]:  # warm-up
        state, metrics = train_chunk(state, chunk)
        jax.block_until_ready(metrics)
    calls = max(steps // k, 1)
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        start = time.perf_counter()
        for i in range(calls):
            state, metrics = train_chunk(state, chunks[i % len(chunks)])
            jax.block_until_ready(metrics)
        wall_ms = 1e3 * (time.perf_counter() - start) / (calls * k)
        jax.profiler.stop_trace()
        (path,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
        busy = xla_busy_ms(path, hlo_instructions(train_chunk.as_text()))
    return busy, wall_ms


# ----------------------------------------------------------------------------- torch's side

_TORCH_OPS = (
    (MATMUL, ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm")),
    (
        ATTENTION,
        (
            "aten::_softmax",
            "aten::_softmax_backward_data",
            "aten::masked_fill",
            "aten::_scaled_dot_product_flash_attention_for_cpu",
        ),
    ),
    (ACTIVATION, ("aten::gelu", "aten::gelu_backward")),
    (NORMS, ("aten::native_layer_norm", "aten::native_layer_norm_backward")),
    (
        EMBED_LOSS,
        (
            "aten::embedding",
            "aten::embedding_dense_backward",
            "aten::index_select",
            "aten::_log_softmax",
            "aten::_log_softmax_backward_data",
            "aten::nll_loss",
            "aten::nll_loss_forward",
            "aten::nll_loss_backward",
        ),
    ),
)


def torch_category(name: str, in_optimizer: bool) -> str:
    if in_optimizer:
        return OPTIMIZER
    for category, prefixes in _TORCH_OPS:
        if any(name == p or name.startswith(p + "_") for p in prefixes):
            return category
    return OTHER


def torch_account(config: Any, batches: Any, vocab_size: int, steps: int):
    """(self ms per category over the profiled steps, wall ms per step) of the eager twin."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.train_throughput import torch_column

    column = torch_column(
        "torch", config, vocab_size, batches, compile_=False, autocast=False, max_steps=None
    )
    column.run(0, 3)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        column.run(3, steps)
        wall_ms = 1e3 * (time.perf_counter() - start) / steps
    busy: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        parent, in_optimizer = event.cpu_parent, False
        while parent is not None and not in_optimizer:
            in_optimizer = parent.name.startswith(("Optimizer.", "clip_grad"))
            parent = parent.cpu_parent
        busy[torch_category(event.name, in_optimizer)] += event.self_cpu_time_total / 1e3
    return dict(busy), wall_ms


# ----------------------------------------------------------------------------- the account


def per_step(busy: dict[str, float], wall_ms: float, steps: int) -> dict[str, float]:
    """ms per step by category: each category's share of the busy time, times the wall time
    per step less the host's (the wall time no op covers, when the ops cover less)."""
    total = sum(busy.values())
    ops_ms = min(total / steps, wall_ms) if total else 0.0
    account = {c: ops_ms * busy.get(c, 0.0) / total if total else 0.0 for c in CATEGORIES}
    account[HOST] = wall_ms - ops_ms
    return account


def main(argv: list[str] | None = None) -> None:
    from benchmarks import machine
    from benchmarks.train_throughput import pin_cores, token_batches
    from minigpt_jax.config_dict import check_experiment_config, config_file_of, load_config_file

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="shakespeare_char")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--data", help="the folder of tinyshakespeare.txt")
    parser.add_argument("--synthetic", action="store_true", help="random token ids")
    parser.add_argument("--threads", type=int, help="pin both sides to the first N cores")
    parser.add_argument("--no-torch", action="store_true", help="XLA's account only")
    parser.add_argument("--clock-ghz", type=float, help="core clock for the peak (boost clock)")
    args = parser.parse_args(argv)

    threads = pin_cores(args.threads)
    config = check_experiment_config(load_config_file(config_file_of(args.config)))
    k = config.steps_per_call
    steps = max(args.steps // k, 1) * k
    batches, vocab_size = token_batches(config, args, steps + 2 * k)
    cpu = machine.this_cpu()
    peak = machine.peaks(cpu, threads, args.clock_ghz)["float32"]
    print("\n".join(machine.describe(cpu, threads, {"float32": peak})), flush=True)

    from minigpt_jax import flops_per_token
    from minigpt_jax.config_dict import gpt_config_from

    cfg = gpt_config_from(config, vocab_size)
    tokens = config.batch_size * config.model.block_size
    at_peak_ms = 1e3 * flops_per_token(cfg) * tokens / (peak.gflops * 1e9)

    gaps = []
    if not args.no_torch:
        from benchmarks.torch_reference import twin_gaps

        gaps = twin_gaps(cfg, config.optim)
    if gaps:
        print(f"the torch eager column is left out: the PyTorch twin lacks {'; '.join(gaps)}.")
    sides = {"minigpt-jax": per_step(*xla_account(config, batches, vocab_size, steps), steps)}
    if not args.no_torch and not gaps:
        torch_busy, torch_wall = torch_account(config, batches, vocab_size, steps)
        sides["torch eager"] = per_step(torch_busy, torch_wall, steps)
    header = f"{'category':24s}" + "".join(f" {name:>20s}" for name in sides)
    print(f"\n{args.config}: {steps} steps profiled, ms/step (share)\n{header}")
    print("-" * len(header))
    for category in CATEGORIES:
        cells = "".join(
            f" {side[category]:10.2f} ({side[category] / sum(side.values()):5.1%})"
            for side in sides.values()
        )
        print(f"{category:24s}{cells}")
    totals = "".join(f" {sum(side.values()):10.2f} {'':8s}" for side in sides.values())
    print(f"{'wall per step':24s}{totals}")
    print(
        f"matmuls at the float32 peak ({peak.gflops:.0f} GFLOP/s): {at_peak_ms:.2f} ms/step "
        f"(the model's {flops_per_token(cfg) / 1e6:.2f} MFLOP a token "
        f"× {tokens} tokens)\n* XLA: the mask and softmax (its matmuls are in matmuls); torch: "
        "scaled_dot_product_attention's fused CPU kernel, forward and backward, matmuls included"
    )


if __name__ == "__main__":
    main()
