"""GPT-2 small (124M) training throughput and MFU on one accelerator, in bfloat16.

Run:      python -m benchmarks.gpu_mfu                       # on a GPU (H100/H200: 989 TFLOP/s)
          python -m benchmarks.gpu_mfu --preset smoke        # a seconds-long check on any CPU
Prints:   ms/step (median, p10, p90), tokens/s, model TFLOP/s and MFU against the peak bf16 rate.

FLOPs per token follow nanoGPT's estimate (PaLM appendix B): 6·N + 12·L·H·K·T, where N counts
every parameter but the position table. Synthetic tokens: throughput does not depend on data.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from minigpt_jax import GPTConfig, count_params, flops_per_token
from minigpt_jax.run_config import gpt_config_from, load_config_file
from minigpt_jax.train import init_state, make_optimizer, make_train_chunk

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
# configs/gpt2_small.py's optimizer, with a short warmup: the timed steps are the first few.
WARMUP_STEPS = 10


GPT2_SMALL = load_config_file(str(CONFIGS / "gpt2_small.py"))

PRESETS = {
    "gpt2_small": dict(cfg=gpt_config_from(GPT2_SMALL, vocab_size=50257), batch_size=16),
    "smoke": dict(
        cfg=GPTConfig(
            vocab_size=256,
            block_size=64,
            n_layer=2,
            n_head=2,
            n_embd=64,
            dropout=0.0,
            dtype="bfloat16",
        ),
        batch_size=4,
    ),
}


def measure(cfg: GPTConfig, batch_size: int, steps: int, steps_per_call: int, peak_flops: float):
    """Times `steps` compiled calls of `steps_per_call` train steps each; returns a result dict."""
    optim = GPT2_SMALL.optim.copy_and_resolve_references()
    optim.warmup_steps = WARMUP_STEPS
    tx, schedule = make_optimizer(optim, 1000)
    state = jax.jit(lambda rng: init_state(cfg, tx, rng))(jax.random.key(0))
    batches = np.random.default_rng(0).integers(
        0, cfg.vocab_size, (steps_per_call, batch_size, cfg.block_size + 1), dtype=np.int32
    )
    batches = jax.device_put(batches)
    start = time.perf_counter()
    chunk = make_train_chunk(cfg, tx, schedule).lower(state, batches).compile()
    compile_s = time.perf_counter() - start
    state, metrics = chunk(state, batches)  # warm-up
    jax.block_until_ready(metrics)
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = chunk(state, batches)
        jax.block_until_ready(metrics)
        seconds.append((time.perf_counter() - start) / steps_per_call)
    ms = sorted(1000 * s for s in seconds)
    median_s = statistics.median(seconds)
    tokens = batch_size * cfg.block_size
    achieved = flops_per_token(cfg) * tokens / median_s
    return {
        "compile_s": compile_s,
        "ms_median": statistics.median(ms),
        "ms_p10": ms[int(0.1 * (len(ms) - 1))],
        "ms_p90": ms[int(0.9 * (len(ms) - 1))],
        "tokens_per_s": tokens / median_s,
        "tflops": achieved / 1e12,
        "mfu": achieved / peak_flops,
        "final_loss": float(metrics["loss"][-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpt2_small")
    parser.add_argument("--batch_size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=10, help="timed compiled calls")
    parser.add_argument("--steps_per_call", type=int, default=1)
    parser.add_argument("--peak_tflops", type=float, default=989.0, help="H100/H200 bf16 dense")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    cfg, batch_size = preset["cfg"], args.batch_size or preset["batch_size"]
    print(f"devices: {jax.devices()}")
    print(
        f"model: {count_params(cfg):,} params, {cfg.dtype} compute, batch {batch_size} x "
        f"{cfg.block_size}, {flops_per_token(cfg) / 1e9:.3f} GFLOP/token"
    )
    result = measure(cfg, batch_size, args.steps, args.steps_per_call, args.peak_tflops * 1e12)
    print(
        f"compile {result['compile_s']:.1f} s | ms/step median {result['ms_median']:.2f} "
        f"(p10 {result['ms_p10']:.2f}, p90 {result['ms_p90']:.2f}) | "
        f"{result['tokens_per_s']:,.0f} tokens/s | {result['tflops']:.1f} TFLOP/s | "
        f"MFU {100 * result['mfu']:.1f}% of {args.peak_tflops:.0f} TFLOP/s | "
        f"loss {result['final_loss']:.3f}"
    )


if __name__ == "__main__":
    main()
