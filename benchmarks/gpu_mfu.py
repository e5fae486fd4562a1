"""GPT-2 small (124M) training on one accelerator: minigpt-jax beside its PyTorch twin, in bf16.

Run:      python -m benchmarks.gpu_mfu                     # on a GPU (H100/H200: 989 TFLOP/s)
          python -m benchmarks.gpu_mfu --variants          # + every JAX setting in VARIANTS
          python -m benchmarks.gpu_mfu --variants "remat dots" "batch 32"   # + these ones
          python -m benchmarks.gpu_mfu --preset smoke      # a seconds-long check on any CPU
Columns:  "jax default" is configs/gpt2_small.py as `minigpt-jax train` runs it (steps_per_call
          steps per compiled call). "torch" is benchmarks/torch_reference.TorchGPT, the same
          model (vocabulary padding included) from the same initial weights, under bf16 autocast
          with float32 params, on CUDA with torch.compile, flash attention
          (F.scaled_dot_product_attention held to its FLASH_ATTENTION backend) and fused AdamW
          (nanoGPT's setup); on a CPU it runs eager (--torch-compile to compile there too). Same
          batch, same AdamW settings, schedule and clipping. The columns alternate within
          each of --rounds rounds, so drifting clocks and neighbours hit them alike.
Prints:   ms/step (median, p10, p90 over all rounds), tokens/s, model TFLOP/s, MFU against
          --peak_tflops, the ratio to the torch column, compile time, the last loss.

FLOPs per token follow nanoGPT's estimate (PaLM appendix B): 6·N + 12·L·H·K·T, where N counts
every parameter but the position table and the vocabulary padding. Synthetic tokens:
throughput does not depend on data.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from benchmarks import columns as benchmark_columns
from benchmarks.columns import Column, chunk_column, torch_twin
from minigpt_jax import GPTConfig, count_params, flops_per_token
from minigpt_jax.config_dict import gpt_config_from, load_config_file
from minigpt_jax.optimizers import make_optimizer
from minigpt_jax.train.step import init_state, make_train_chunk

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
# configs/gpt2_small.py's optimizer, with a short warmup and schedule: the timed steps are the
# first ones of a run.
WARMUP_STEPS = 10
SCHEDULE_STEPS = 1000


GPT2_SMALL = load_config_file(str(CONFIGS / "gpt2_small.py"))

PRESETS = {
    "gpt2_small": dict(
        cfg=gpt_config_from(GPT2_SMALL, vocab_size=50257),
        batch_size=16,
        steps_per_call=GPT2_SMALL.steps_per_call,
    ),
    "smoke": dict(
        cfg=GPTConfig(
            vocab_size=250,
            block_size=64,
            n_layer=2,
            n_head=2,
            n_embd=64,
            dropout=0.0,
            dtype="bfloat16",
            vocab_multiple=64,
        ),
        batch_size=4,
        steps_per_call=2,
    ),
}

# JAX settings timed by --variants, each against "jax default": GPTConfig fields, "batch_size",
# "steps_per_call", "donate", and XLA compiler options (keys starting "xla_", the same as
# XLA_FLAGS, for this one compile). A variant that fails to compile is reported, not fatal.
VARIANTS: dict[str, dict[str, Any]] = {
    "vocabulary not padded": {"vocab_multiple": 1},
    "attention xla": {"attention": "xla"},
    "attention explicit (softmax)": {"attention": "explicit"},
    "loss in chunks of 2048 tokens": {"loss_chunk": 2048},
    "remat dots": {"remat": "dots"},
    "remat full": {"remat": "full"},
    "batch 32": {"batch_size": 32},
    "batch 32, remat dots": {"batch_size": 32, "remat": "dots"},
    "1 step per call": {"steps_per_call": 1},
    "no donation": {"donate": False},
    "latency-hiding scheduler": {"xla_gpu_enable_latency_hiding_scheduler": True},
    "Triton GEMM off": {"xla_gpu_enable_triton_gemm": False},
    "Triton GEMM on": {"xla_gpu_enable_triton_gemm": True},
    "command buffers off": {"xla_gpu_enable_command_buffer": ""},
}


# ----------------------------------------------------------------------------- columns


def _optim():
    optim = GPT2_SMALL.optim.copy_and_resolve_references()
    optim.warmup_steps = WARMUP_STEPS
    return optim


def _batches(cfg: GPTConfig, batch_size: int, count: int) -> np.ndarray:
    shape = (count, batch_size, cfg.block_size + 1)
    return np.random.default_rng(0).integers(0, cfg.vocab_size, shape, dtype=np.int32)


def jax_column(
    name: str,
    cfg: GPTConfig,
    batch_size: int,
    steps_per_call: int,
    num_batches: int,
    *,
    donate: bool = True,
    compiler_options: dict[str, Any] | None = None,
) -> Column:
    """minigpt-jax's compiled train chunk (`make_train_chunk`), state initialised on device;
    step s trains on batch s % num_batches (a multiple of steps_per_call)."""
    tx, schedule = make_optimizer(_optim(), SCHEDULE_STEPS)
    state = jax.jit(lambda rng: init_state(cfg, tx, rng))(jax.random.key(0))
    batches = _batches(cfg, batch_size, num_batches)
    chunks = [jax.device_put(c) for c in batches.reshape(-1, steps_per_call, *batches.shape[1:])]
    start = time.perf_counter()
    chunk = make_train_chunk(cfg, tx, schedule, donate=donate).lower(state, chunks[0])
    chunk = chunk.compile(compiler_options=compiler_options or None)
    compile_s = time.perf_counter() - start
    options = " ".join(f"{k}={v!r}" for k, v in (compiler_options or {}).items())
    note = f"K={steps_per_call} attention={cfg.attention} remat={cfg.remat} {options}".strip()
    return chunk_column(
        name, chunk, state, chunks, compile_s=compile_s, note=note, batch_size=batch_size
    )


def torch_column(
    cfg: GPTConfig, batch_size: int, num_batches: int, *, compile_: bool | None = None
) -> Column:
    """TorchGPT from the JAX init: CUDA + bf16 autocast + torch.compile + flash SDPA + fused
    AdamW where a GPU is, eager float32-params/bf16-autocast on CPU (compile_ overrides)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.torch_reference import make_torch_optimizer

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    compile_ = cuda if compile_ is None else compile_
    torch.backends.cuda.matmul.allow_tf32 = True  # nanoGPT: TF32 for any float32 matmul left
    torch.backends.cudnn.allow_tf32 = True
    twin_cfg = cfg.replace(dtype="float32", param_dtype="float32")  # autocast does the bf16
    model = torch_twin(twin_cfg, seed=0).to(device)
    optimizer, scheduler = make_torch_optimizer(model, _optim(), SCHEDULE_STEPS)
    # The JAX column's batches, in its order: step s trains on batch s % num_batches.
    batches = torch.from_numpy(_batches(cfg, batch_size, num_batches)).long().to(device)
    xs, ys = batches[:, :, :-1].contiguous(), batches[:, :, 1:].contiguous()
    step_model = torch.compile(model) if compile_ else model
    half = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(cfg.dtype)

    @contextlib.contextmanager
    def context():  # flash attention on CUDA (on CPU whichever SDPA kernel torch picks), autocast
        kernels = sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if cuda else contextlib.nullcontext()
        with kernels, torch.autocast(device, half, enabled=half is not None):
            yield

    note = f"{device} {'bf16 autocast' if half else 'float32'}" + (
        ", flash SDPA, fused AdamW" if cuda else ""
    )
    column = benchmark_columns.torch_column(
        "torch.compile" if compile_ else "torch eager",
        step_model,
        optimizer,
        scheduler,
        xs,
        ys,
        grad_clip=GPT2_SMALL.optim.grad_clip,
        context=context,
        note=note,
        batch_size=batch_size,
    )
    timed = column.run

    def run(first_step: int, n: int) -> list[float]:
        times = timed(first_step, n)
        if compile_ and column.compile_s is None:  # the first step compiled
            column.compile_s = times[0]
        return times

    column.run = run
    return column


RUN_KEYS = ("batch_size", "steps_per_call", "donate")


def split_overrides(overrides: dict[str, Any]) -> tuple[dict, dict, dict]:
    """A VARIANTS entry as (GPTConfig fields, run keys, XLA compiler options)."""
    options = {k: v for k, v in overrides.items() if k.startswith("xla_")}
    run = {k: v for k, v in overrides.items() if k in RUN_KEYS}
    fields = {k: v for k, v in overrides.items() if k not in options and k not in run}
    return fields, run, options


def variant_column(
    name: str,
    cfg: GPTConfig,
    batch_size: int,
    steps_per_call: int,
    num_batches: int,
    overrides: dict[str, Any],
) -> Column:
    """The default column with `overrides` (a VARIANTS entry) applied."""
    fields, run, options = split_overrides(overrides)
    return jax_column(
        name,
        cfg.replace(**fields),
        run.get("batch_size", batch_size),
        run.get("steps_per_call", steps_per_call),
        num_batches,
        donate=run.get("donate", True),
        compiler_options=options,
    )


# ----------------------------------------------------------------------------- report


def summarize(times_s: list[float], tokens_per_step: int, flops: float, peak_flops: float):
    """Figures of one column from its per-step seconds."""
    ms = sorted(1000 * s for s in times_s)
    median_s = statistics.median(times_s)
    achieved = flops * tokens_per_step / median_s
    return {
        "ms_median": 1000 * median_s,
        "ms_p10": ms[int(0.1 * (len(ms) - 1))],
        "ms_p90": ms[math.ceil(0.9 * (len(ms) - 1))],
        "tokens_per_s": tokens_per_step / median_s,
        "tflops": achieved / 1e12,
        "mfu": achieved / peak_flops,
    }


def report(columns: list[Column], cfg: GPTConfig, block: int, peak_flops: float, ref: str):
    """The table; "/torch" is the ratio of time per token to the torch column's."""
    flops = flops_per_token(cfg)
    results = {
        c.name: summarize(c.times_s, c.batch_size * block, flops, peak_flops) for c in columns
    }
    ref_tps = results[ref]["tokens_per_s"] if ref in results else None
    header = (
        f"{'column':34} {'batch':>5} {'median':>8} {'p10':>8} {'p90':>8} {'tok/s':>10} "
        f"{'TFLOP/s':>8} {'MFU':>6} {'/torch':>6} {'compile':>8} {'loss':>6}  settings"
    )
    print(header)
    print("-" * len(header))
    for column in columns:
        r = results[column.name]
        ratio = f"{ref_tps / r['tokens_per_s']:6.2f}" if ref_tps else "     -"
        compile_s = f"{column.compile_s:7.1f}s" if column.compile_s is not None else "       -"
        print(
            f"{column.name:34} {column.batch_size:5d} {r['ms_median']:8.2f} {r['ms_p10']:8.2f} "
            f"{r['ms_p90']:8.2f} {r['tokens_per_s']:10,.0f} {r['tflops']:8.1f} "
            f"{100 * r['mfu']:5.1f}% {ratio} {compile_s} {column.losses[-1]:6.3f}  {column.note}"
        )
    if ref_tps and ref != "jax default":
        print(
            f"jax default / {ref}: {ref_tps / results['jax default']['tokens_per_s']:.3f} of the "
            f"time per token (below 1: minigpt-jax is faster)"
        )
    same_work = [c for c in columns if c.batch_size == columns[0].batch_size]
    gaps = ", ".join(
        f"{c.name} {abs(c.losses[-1] - columns[0].losses[-1]):.1e}" for c in same_work[1:]
    )
    print(
        f"loss after {len(columns[0].losses)} steps: {columns[0].losses[-1]:.4f} (jax default); "
        f"|difference| (same batches, bf16): {gaps or '-'}"
    )
    return results


# ----------------------------------------------------------------------------- main


def chosen_variants(names: list[str] | None, parser: argparse.ArgumentParser) -> dict:
    """The VARIANTS entries --variants names: none without the flag, all with it alone."""
    if names is None:
        return {}
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown --variants {unknown}; the names are: {', '.join(VARIANTS)}")
    return {name: VARIANTS[name] for name in names or VARIANTS}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpt2_small")
    parser.add_argument("--batch_size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per column a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps_per_call", type=int, default=None)
    parser.add_argument("--peak_tflops", type=float, default=989.0, help="H100/H200 bf16 dense")
    parser.add_argument("--no-torch", dest="torch", action="store_false")
    parser.add_argument("--torch-compile", action="store_true", help="also on CPU")
    parser.add_argument(
        "--variants",
        nargs="*",
        metavar="NAME",
        help="time these VARIANTS entries beside the default (every one when none is named)",
    )
    args = parser.parse_args(argv)
    variants = chosen_variants(args.variants, parser)
    preset = PRESETS[args.preset]
    cfg = preset["cfg"]
    batch_size = args.batch_size or preset["batch_size"]
    k = args.steps_per_call or preset["steps_per_call"]
    print(f"devices: {jax.devices()}  jax {jax.__version__}")
    print(
        f"model: {count_params(cfg):,} params (+{cfg.padded_vocab_size - cfg.vocab_size} padded "
        f"vocabulary rows), {cfg.dtype} compute, batch {batch_size} x {cfg.block_size}, "
        f"{flops_per_token(cfg) / 1e9:.3f} GFLOP/token"
    )
    # Every column trains the same steps on the same batches: `span` of them, a multiple of
    # every column's steps per call, cycled; the first `span` steps, untimed, warm up (and
    # compile torch.compile).
    ks = [k] + [o["steps_per_call"] for o in variants.values() if "steps_per_call" in o]
    span = int(np.lcm.reduce(ks))
    steps = -(-args.steps // span) * span
    columns = [jax_column("jax default", cfg, batch_size, k, span)]
    if args.torch:
        columns.append(torch_column(cfg, batch_size, span, compile_=args.torch_compile or None))
    for name, overrides in variants.items():
        try:
            columns.append(variant_column(name, cfg, batch_size, k, span, overrides))
        except Exception as error:  # a flag this XLA lacks, out of memory: report, go on
            print(f"variant {name!r} failed: {type(error).__name__}: {str(error)[:200]}")
    for column in columns:
        column.run(0, span)
    for r in range(args.rounds):
        for column in columns:
            column.times_s.extend(column.run(span + r * steps, steps))
    ref = columns[1].name if args.torch else "jax default"
    return report(columns, cfg, cfg.block_size, args.peak_tflops * 1e12, ref)


if __name__ == "__main__":
    main()
