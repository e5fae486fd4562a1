"""Training throughput: minigpt-jax against its PyTorch twin, side by side in one process.

Run:      python -m benchmarks.train_throughput [--config configs/shakespeare_char.py]
              [--data DIR | --synthetic] [--steps 100] [--rounds 5] [--threads N]
              [--variants | --only NAME ...] [--torch-compile] [--clock-ghz 3.6 | --peak-gflops 230]
Needs:    the `bench` extra (torch); tinyshakespeare.txt in --data or $MINIGPT_JAX_DATA (or
          --synthetic for random tokens).
Measures: the config's model, batch and optimizer trained for --steps steps per round by
          minigpt-jax (`make_train_chunk`: K = steps_per_call steps per compiled call, a step
          costs call time / K) and by `benchmarks.torch_reference.TorchGPT` (same architecture and
          GELU form, same initial weights through `load_jax_params`, same batches, AdamW with the
          same settings and schedule, clipping at grad_clip). The columns alternate within every
          round, so load from other processes hits them alike; warm-up steps (compiles, first
          calls) are excluded. Both sides use the same cores: all of them, or the first
          --threads N, pinned.
Prints:   the CPU, its extensions and peaks first (benchmarks/machine.py); then ms/step (median,
          p10, p90 over all rounds), tokens/s, achieved GFLOP/s (nanoGPT's 6N + 12·L·H·K·T FLOP
          per token), MFU against the peak of those cores for the column's matmul dtype and
          against a float32 matmul timed in the same run, the ratios to PyTorch eager and to the
          JAX default, and the JAX compile time. Every run times the default beside its other
          matmul dtype (GPTConfig.matmul_dtype: bf16 operands with float32 sums where the
          training step's "auto" multiplies in float32, float32 where it picks bf16).
          `--variants` adds a row for each JAX setting tried (VARIANTS: config overrides and XLA
          options), so the output documents what won and what did not.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import columns as benchmark_columns
from benchmarks import machine
from benchmarks.columns import Column, chunk_column, torch_twin

# JAX settings timed by --variants, on top of --config: dotted keys are config overrides, keys
# starting "xla_" are XLA compiler options (the same as XLA_FLAGS, for this one compile). The
# first rows add one kept change at a time; "default" is --config unchanged, what
# `minigpt-jax train` runs; the rows after it each change one thing and were not kept.
_PLAIN = {"steps_per_call": 1, "model.gelu_approximate": False, "model.dense_grad": "autodiff"}
_SCAN = {**_PLAIN, "steps_per_call": 10}
_TANH = {**_SCAN, "model.gelu_approximate": True}
_YNN = "xla_cpu_experimental_ynn_fusion_type"
DEFAULT = "default"
VARIANTS: dict[str, dict[str, Any]] = {
    "fp32 erf-GELU K=1 (plain)": _PLAIN,
    "+ scan K=10": _SCAN,
    "+ tanh GELU": _TANH,
    DEFAULT: {},  # + the direct Dense VJP
    "default, erf GELU": {"model.gelu_approximate": False},
    "default, K=25": {"steps_per_call": 25},
    "default, bf16 activations": {"model.dtype": "bfloat16"},
    # Printed in every run, beside the default: bf16 operands, float32 sums and weights.
    "default, bf16 matmuls": {"model.matmul_dtype": "bfloat16"},
    "default, float32 matmuls": {"model.matmul_dtype": "float32"},
    # For a Muon config (--config configs/speedrun_char.py --only ...), not in --variants.
    "default, float32 Muon Newton-Schulz": {"optim.muon_ns_dtype": "float32"},
    "default, bf16 Muon Newton-Schulz": {"optim.muon_ns_dtype": "bfloat16"},
    "default, YNNPACK off (Eigen dots)": {_YNN: ""},
    "default, YNNPACK dot fusion": {_YNN: "LIBRARY_FUSION_TYPE_DOT"},
    "default, fusion emitters off": {"xla_cpu_use_fusion_emitters": False},
    "default, Eigen single-threaded": {"xla_cpu_multi_thread_eigen": False},
    "default, fast math (unsafe)": {"xla_cpu_enable_fast_math": True},
    "default, jax.nn.dot_product_attention (xla)": {"model.attention": "xla"},
    "default, loss in chunks of 128 tokens": {"model.loss_chunk": 128},
}
PLAIN, BF16 = "fp32 erf-GELU K=1 (plain)", "default, bf16 activations"
BF16_MATMULS, FP32_MATMULS = "default, bf16 matmuls", "default, float32 matmuls"
MUON_NS = ("default, float32 Muon Newton-Schulz", "default, bf16 Muon Newton-Schulz")

# Tried during development with throwaway A/B scripts whose code was not kept, so this script
# cannot re-time them: the change and what became of it (benchmarks/README.md).
NOT_KEPT: tuple[tuple[str, str], ...] = (
    ("tanh GELU written with sigmoid", "slower than jax.nn.gelu's tanh form"),
    ("explicit transposes so dW is a plain NN dot (float32)", "slower: the transposes cost more"),
    ("head-major q/k/v einsums", "no gain beyond noise"),
    ("one-hot cross-entropy", "no gain beyond noise"),
    ("optimizer over one flat vector (optax.flatten)", "no gain beyond noise"),
    ("XNNPACK / oneDNN dot fusion", "slower, or a crash (oneDNN)"),
    ("2 host devices, data parallel (XLA_FLAGS)", "no gain beyond noise"),
    ("forward as 2 or 3 concurrent batch groups", "no gain beyond noise"),
    ("Muon's bf16 Newton-Schulz: the whole iteration in bf16", "slower, 3x the error"),
    ("Muon: same-shaped matrices in one batched Newton-Schulz", "1.05x slower (1.04x on AMX)"),
    ("attention's einsums on bf16 operands (AMX Xeon)", "1.5x slower: batched bf16 dots"),
    ("q/k/v split via one head-major transpose (AMX Xeon)", "1.04-1.11x slower"),
    ("LayerNorm: two reductions, not the paired one (AMX)", "no gain beyond noise"),
    ("XLA:CPU prefer_vector_width=512, concurrency scheduler", "no gain beyond noise"),
)


# ----------------------------------------------------------------------------- machine


def pin_cores(threads: int | None) -> int:
    """Restricts this process to `threads` CPUs (before JAX and torch start their pools)."""
    cpus = sorted(os.sched_getaffinity(0))
    if threads:
        if threads > len(cpus):
            raise SystemExit(f"--threads {threads}: only {len(cpus)} CPUs are available.")
        cpus = cpus[:threads]
        os.sched_setaffinity(0, cpus)
    return len(cpus)


def xla_threads() -> int:
    """Threads of XLA's CPU intra-op pool that exist now (named tf_XLAEigen...)."""
    names = [p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")]
    return sum(name.startswith("tf_XLAEigen") for name in names)


# ----------------------------------------------------------------------------- setup


def with_overrides(config, overrides: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A copy of `config` with dotted keys ("model.dtype") replaced, and the "xla_" keys as
    compiler options."""
    config = config.copy_and_resolve_references()
    compiler_options = {k: v for k, v in overrides.items() if k.startswith("xla_")}
    for key, value in overrides.items():
        if key in compiler_options:
            continue
        node = config
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node[parent]
        if leaf not in node:
            raise KeyError(f"variant key {key!r} is not in the config.")
        node[leaf] = value
    return config, compiler_options


def token_batches(config, args, num_steps: int) -> tuple[np.ndarray, int]:
    """num_steps batches (num_steps, B, T+1) of the real corpus (or random ids) and V."""
    from minigpt_jax.data.dataset import get_batch
    from minigpt_jax.data.in_memory import prepare_dataset

    block_size = config.model.block_size
    if args.synthetic:
        vocab_size = 65 if config.data.tokenizer == "char" else config.data.vocab_size
        rng = np.random.default_rng(config.seed)
        shape = (num_steps, config.batch_size, block_size + 1)
        return rng.integers(0, vocab_size, shape).astype(np.int32), vocab_size
    path = args.data or config.data.path
    with tempfile.TemporaryDirectory() as workdir:
        dataset = prepare_dataset(
            config.data.corpus,
            path,
            config.data.tokenizer,
            config.data.vocab_size,
            block_size,
            workdir,
            config.data.val_fraction,
        )
    batches = [
        get_batch(dataset.train, config.batch_size, block_size, seed=config.seed, step=s)
        for s in range(num_steps)
    ]
    return np.stack(batches), dataset.tokenizer.vocab_size


# ----------------------------------------------------------------------------- runners


def compiled_chunk(
    config, vocab_size: int, batches: np.ndarray, compiler_options: dict[str, Any] | None = None
) -> tuple[Any, Any, list[Any], float]:
    """(the compiled train chunk of config.steps_per_call steps, the initial train state, the
    batches as device chunks (C, B, T+1), the compile seconds)."""
    import jax

    from minigpt_jax.config_dict import gpt_config_from
    from minigpt_jax.optimizers import make_optimizer
    from minigpt_jax.train.step import init_state, make_train_chunk

    cfg = gpt_config_from(config, vocab_size)
    k = config.steps_per_call
    tx, schedule = make_optimizer(config.optim, config.num_steps)
    state = init_state(cfg, tx, jax.random.key(config.seed))
    chunks = [jax.device_put(c) for c in batches.reshape(-1, k, *batches.shape[1:])]
    start = time.perf_counter()
    train_chunk = make_train_chunk(cfg, tx, schedule).lower(state, chunks[0])
    train_chunk = train_chunk.compile(compiler_options=compiler_options or None)
    return train_chunk, state, chunks, time.perf_counter() - start


def jax_column(
    name: str, config, vocab_size: int, batches: np.ndarray, compiler_options: dict[str, Any]
) -> Column:
    from minigpt_jax.config_dict import gpt_config_from

    cfg = gpt_config_from(config, vocab_size)
    train_chunk, state, chunks, compile_s = compiled_chunk(
        config, vocab_size, batches, compiler_options
    )
    # Copies and transposes in the compiled call: what layout choices (dense_grad) leave XLA.
    copies = len(re.findall(r"\s(?:copy|transpose)\(", train_chunk.as_text()))
    options = [f"{key}={value!r}" for key, value in compiler_options.items()]
    note = " ".join([_model_note(cfg), f"copies={copies}", *options])
    column = chunk_column(name, train_chunk, state, chunks, compile_s=compile_s, note=note)
    column.dtype = _matmul_operand_dtype(cfg)
    return column


def torch_column(
    name: str,
    config,
    vocab_size: int,
    batches: np.ndarray,
    *,
    compile_: bool,
    autocast: bool,
    max_steps: int | None = None,
) -> Column:
    """TorchGPT with the JAX columns' initial weights; `max_steps` caps the timed steps of a
    round, for a column too slow to time in full."""
    import torch

    from benchmarks.torch_reference import make_torch_optimizer
    from minigpt_jax.config_dict import gpt_config_from

    cfg = gpt_config_from(config, vocab_size).replace(dtype="float32", param_dtype="float32")
    model = torch_twin(cfg, config.seed)
    optimizer, scheduler = make_torch_optimizer(model, config.optim, config.num_steps)
    xs = [torch.from_numpy(np.ascontiguousarray(b[:, :-1])).long() for b in batches]
    ys = [torch.from_numpy(np.ascontiguousarray(b[:, 1:])).long() for b in batches]
    gelu = "tanh" if cfg.gelu_approximate else "erf"
    precision = "bf16 autocast" if autocast else "float32"
    column = benchmark_columns.torch_column(
        name,
        torch.compile(model) if compile_ else model,
        optimizer,
        scheduler,
        xs,
        ys,
        grad_clip=config.optim.grad_clip,
        context=lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        note=f"gelu={gelu} {precision}",
        max_steps=max_steps,
    )
    column.dtype = "bfloat16" if autocast else "float32"
    return column


def _matmul_operand_dtype(cfg) -> str:
    """The dtype the Dense matmuls multiply in: what the column's MFU is read against."""
    from minigpt_jax.model.speed import backend

    return "bfloat16" if backend.for_training(cfg).matmul_dtype == "bfloat16" else cfg.dtype


def matmul_counterpart(config) -> str:
    """The VARIANTS name timed beside the default in every run: the matmul dtype that "auto"
    does not pick here (bf16 matmuls where the default multiplies in float32, and the other
    way)."""
    from minigpt_jax.config_dict import gpt_config_from

    cfg = gpt_config_from(config, config.data.vocab_size)  # any V: the dtype ignores it
    return BF16_MATMULS if _matmul_operand_dtype(cfg) == "float32" else FP32_MATMULS


def _model_note(cfg) -> str:
    """The model's speed settings, "auto" ones as this backend resolves them."""
    from minigpt_jax.model.speed import backend
    from minigpt_jax.model.speed.kernels import choose_kernel

    gelu = "tanh" if cfg.gelu_approximate else "erf"
    attention = choose_kernel(cfg, weight_dropout=cfg.dropout > 0, cached=False)
    chunk = f" loss_chunk={cfg.loss_chunk}" if cfg.loss_chunk else ""
    matmul = backend.matmul_dtype(backend.for_training(cfg))
    if matmul == "bfloat16" and not backend.bf16_matmuls_pay():
        matmul += "(no bf16 dot unit: converted to float32)"
    return (
        f"gelu={gelu} {cfg.dtype} dense_grad={backend.dense_grad(cfg)} "
        f"norm_grad={backend.norm_grad(cfg)} attention={attention} matmul={matmul}" + chunk
    )


# ----------------------------------------------------------------------------- report


def sgemm_gflops(n: int = 2048, repeats: int = 10) -> list[float]:
    """GFLOP/s of a jitted (n, n) x (n, n) float32 matmul, once per repeat: what the cores
    really reach on the best case for a dot, to read MFU against."""
    import jax
    import jax.numpy as jnp

    from minigpt_jax.runtime.timing import call_seconds

    a, b = jax.random.normal(jax.random.key(0), (2, n, n), jnp.float32)
    seconds = call_seconds(jax.jit(jnp.matmul), a, b, repeats=repeats)
    return [2 * n**3 / s / 1e9 for s in seconds]


def report(
    columns: list[Column],
    flops: float,
    tokens: int,
    peak_by_dtype: dict[str, machine.Peak],
    sgemm: float,
    reference: str | None,
    baseline: str,
) -> None:
    def median_of(name: str) -> float | None:
        column = next((c for c in columns if c.name == name), None)
        return statistics.median(column.times_s) if column and column.times_s else None

    ref_median, base_median = median_of(reference), median_of(baseline)
    header = (
        f"{'column':36s} {'K':>3s} {'median':>7s} {'p10':>7s} {'p90':>7s} {'tok/s':>7s} "
        f"{'GFLOP/s':>7s} {'MFU':>6s} {'/SGEMM':>6s} {'/torch':>6s} {'/jax':>6s} "
        f"{'compile':>7s}  settings"
    )
    print(header)
    print("-" * len(header))
    for c in columns:
        med = statistics.median(c.times_s)
        deciles = statistics.quantiles(c.times_s, n=10)
        gflops = flops / med / 1e9
        peak = peak_by_dtype.get(c.dtype, peak_by_dtype["float32"])
        ratios = " ".join(f"{med / m:6.2f}" if m else "     -" for m in (ref_median, base_median))
        compile_s = f"{c.compile_s:6.1f}s" if c.compile_s is not None else "      -"
        print(
            f"{c.name:36s} {c.steps_per_call:3d} {1e3 * med:7.1f} {1e3 * deciles[0]:7.1f} "
            f"{1e3 * deciles[-1]:7.1f} {tokens / med:7.0f} {gflops:7.1f} "
            f"{gflops / peak.gflops:6.1%} {gflops / sgemm:6.1%} {ratios} {compile_s}  {c.note}"
        )
    print(
        f"ms/step: all timed steps (JAX: compiled-call time / K, so its p10-p90 spread is "
        f"over calls). /torch, /jax: median over the "
        f"{reference!r} and {baseline!r} medians (<1 is faster). MFU against the peak for "
        f"the column's matmul dtype (above); /SGEMM against the {sgemm:.1f} GFLOP/s a 2048² "
        f"float32 matmul reached in this run."
    )
    if sgemm > peak_by_dtype["float32"].gflops:
        print(
            "note: the matmul beat the computed peak, so the cores run above the clock used; "
            "pass --clock-ghz (boost clock) or --peak-gflops for a true MFU."
        )


def report_losses(columns: list[Column], reference: str) -> None:
    """Same work check: every column trained the same batches from the same weights, so its
    loss after each step should be the reference's, up to its own numerics and model form."""
    ref = next(c for c in columns if c.name == reference)
    diffs = []
    for c in columns:
        if c.capped:
            diffs.append(f"{c.name} - (fewer steps)")
            continue
        diff = max(abs(a - b) for a, b in zip(c.losses, ref.losses, strict=True))
        diffs.append(f"{c.name} {diff:.1e}")
    print(
        f"train loss after the last step: {ref.losses[-1]:.4f} ({reference}); max |loss - "
        f"{reference} loss| over all {len(ref.losses)} steps: " + ", ".join(diffs)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/shakespeare_char.py", help="path[:arg]")
    parser.add_argument("--data", help="dir or file with the corpus ($MINIGPT_JAX_DATA)")
    parser.add_argument("--synthetic", action="store_true", help="random token ids, no corpus")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per column per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of alternating columns")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per column first")
    parser.add_argument("--threads", type=int, help="cores for both sides (default: all)")
    parser.add_argument("--variants", action="store_true", help="time the tried JAX settings too")
    parser.add_argument(
        "--only", action="append", help="a VARIANTS name to time beside the default (repeatable)"
    )
    parser.add_argument("--torch-compile", action="store_true", help="add a torch.compile column")
    parser.add_argument("--no-torch", action="store_true", help="JAX columns only")
    parser.add_argument("--clock-ghz", type=float, help="core clock for the peak (boost clock)")
    parser.add_argument("--peak-gflops", type=float, help="fp32 peak of the pinned cores")
    args = parser.parse_args(argv)

    threads = pin_cores(args.threads)  # before JAX and torch create their thread pools
    cpu = machine.this_cpu()
    peak_by_dtype = machine.peaks(cpu, threads, args.clock_ghz, args.peak_gflops)
    print("\n".join(machine.describe(cpu, threads, peak_by_dtype)), flush=True)
    import jax

    from minigpt_jax import flops_per_token
    from minigpt_jax.config_dict import gpt_config_from, load_config_file

    config = load_config_file(args.config)
    counterpart = matmul_counterpart(config)  # the other matmul dtype, side by side
    overrides = {DEFAULT: {}, counterpart: VARIANTS[counterpart]}
    if args.variants:  # the matmul column that repeats the default is left out
        left_out = (BF16_MATMULS, FP32_MATMULS, *MUON_NS)
        overrides = {k: v for k, v in VARIANTS.items() if k not in left_out}
        overrides[counterpart] = VARIANTS[counterpart]
    if args.only:
        names = [counterpart, *(name for name in args.only if name != counterpart)]
        unknown = [name for name in names if name not in VARIANTS]
        if unknown:
            raise SystemExit(f"--only: unknown variants {unknown}; known: {list(VARIANTS)}.")
        overrides = {DEFAULT: {}, **{name: VARIANTS[name] for name in names}}
    variants = {name: with_overrides(config, o) for name, o in overrides.items()}
    base = variants[DEFAULT][0]
    # Every column trains the same steps on the same batches, in whole compiled calls.
    lcm = int(np.lcm.reduce([c.steps_per_call for c, _ in variants.values()]))
    steps = -(-args.steps // lcm) * lcm
    warmup = -(-args.warmup // lcm) * lcm
    total = warmup + args.rounds * steps
    batches, vocab_size = token_batches(base, args, total)

    columns = [
        jax_column(f"jax {name}", c, vocab_size, batches, options)
        for name, (c, options) in variants.items()
    ]
    reference = "torch eager"
    if not args.no_torch:
        import torch

        torch.set_num_threads(threads)
        torch_columns = [(reference, base, False, False)]
        if args.torch_compile:
            torch_columns.append(("torch.compile", base, True, False))
        if args.variants:
            torch_columns.append(("torch eager erf-GELU", variants[PLAIN][0], False, False))
            torch_columns.append(("torch eager autocast-bf16", variants[BF16][0], False, True))
        for name, c, compile_, autocast in torch_columns:
            # Without bf16 FMA, CPU autocast takes ~1 s/step: 10 steps a round tell it.
            max_steps = 10 if autocast else None
            columns.append(
                torch_column(
                    name,
                    c,
                    vocab_size,
                    batches,
                    compile_=compile_,
                    autocast=autocast,
                    max_steps=max_steps,
                )
            )

    for c in columns:  # compiles and first calls, untimed
        if c.name == "torch.compile":  # its first step compiles
            start = time.perf_counter()
            c.run(0, 1)
            c.compile_s = time.perf_counter() - start
            c.run(1, warmup - 1)
        else:
            c.run(0, warmup)
    load_before = os.getloadavg()[0]
    sgemm = sgemm_gflops()
    for r in range(args.rounds):
        for c in columns:
            c.times_s.extend(c.run(warmup + r * steps, steps))
    sgemm = statistics.median(sgemm + sgemm_gflops())
    load_after = os.getloadavg()[0]

    cfg = gpt_config_from(base, vocab_size)
    flops = flops_per_token(cfg) * base.batch_size * cfg.block_size
    tokens = base.batch_size * cfg.block_size
    print(
        f"{args.config}: batch {base.batch_size} x block {cfg.block_size}, V={vocab_size}, "
        f"{'random ids (--synthetic)' if args.synthetic else 'real corpus'}; "
        f"{flops / 1e9:.3f} GFLOP/step (nanoGPT 6N + 12LHKT); {args.rounds} rounds x {steps} "
        f"steps per column, alternating, after {warmup} warm-up steps"
    )
    threads_line = (
        f"threads: {threads} cores{' pinned' if args.threads else ''}; XLA:CPU intra-op pool "
        f"{xla_threads()} threads, jax {jax.__version__}"
    )
    if not args.no_torch:
        threads_line += (
            f"; torch {torch.__version__} intra-op {torch.get_num_threads()}, "
            f"inter-op {torch.get_num_interop_threads()}"
        )
    print(threads_line)
    print(
        f"load average (1 min) before / after the timed rounds: {load_before:.2f} / "
        f"{load_after:.2f} on {os.cpu_count()} CPUs"
    )
    report(
        columns,
        flops,
        tokens,
        peak_by_dtype,
        sgemm,
        reference if not args.no_torch else None,
        f"jax {DEFAULT}",
    )
    report_losses(columns, reference if not args.no_torch else f"jax {DEFAULT}")
    if args.variants:
        print("\nalso tried, code not kept (benchmarks/README.md):")
        for what, verdict in NOT_KEPT:
            print(f"  {what:50s} {verdict}")


if __name__ == "__main__":
    main()
