"""Generation speed: KV-cached `generate` against recomputing the whole context for every token.

Run:      python -m benchmarks.generate [--new_tokens 500] [--repeats 3]
Model:    configs/shakespeare_char.py's architecture (V=65, 4 layers, 4 heads, d=128, block 64,
          dropout 0) with random-init params: speed does not depend on the weights.
Baseline: nanoGPT's loop, compiled: one jitted call per token runs `forward` over the context
          (the last block_size tokens for learned positions) held in a fixed-width buffer, so it
          compiles once per width and never per step; rope's growing context is padded to the
          next power of two. Sampling, at temperature 1, is shared with `generate`.
Both exclude compile time (a warm-up run first) and wait for the device before reading the clock;
the medians of --repeats runs are printed. Learned positions crop to block_size, so past 64
tokens the cache cannot be reused (see `generate`); rope shows the cache when it is.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax import GPTConfig, forward, generate, init_params
from minigpt_jax.runtime.timing import median_seconds
from minigpt_jax.sampling.filters import sample_token

SHAKESPEARE_CHAR = GPTConfig(
    vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0
)


@functools.partial(jax.jit, static_argnames=("cfg", "width"))
def _naive_step(params, seq_BxL, length, rng, *, cfg, width):
    """Appends token `length` to seq_BxL from `forward` over its last min(length, width) ones."""
    start = jnp.maximum(length - width, 0)
    context_BxW = jax.lax.dynamic_slice_in_dim(seq_BxL, start, width, axis=1)
    logits_BxWxV = forward(params, context_BxW, cfg)
    # Slots past the context hold zeros; causality keeps them out of the last real logits.
    logits_BxV = jax.lax.dynamic_index_in_dim(logits_BxWxV, length - start - 1, 1, False)
    token_B = sample_token(logits_BxV, rng, 1.0)
    return jax.lax.dynamic_update_slice_in_dim(seq_BxL, token_B[:, None], length, axis=1)


def _naive_schedule(cfg, prompt_len, new_tokens):
    """(length, context width) for each step; rope's growing context is padded to a power of 2."""
    widths = (
        cfg.block_size if cfg.pos_encoding == "learned" else 1 << (length - 1).bit_length()
        for length in range(prompt_len, prompt_len + new_tokens)
    )
    return list(zip(range(prompt_len, prompt_len + new_tokens), widths, strict=True))


def naive_generate(params, cfg, prompt_BxT, new_tokens, rng, *, warm_up=False):
    """The crop-and-recompute loop: one compiled forward per new token. `warm_up` runs one step
    per context width instead, which compiles every width."""
    schedule = _naive_schedule(cfg, prompt_BxT.shape[1], new_tokens)
    if warm_up:
        schedule = list({width: (length, width) for length, width in schedule}.values())
    total = prompt_BxT.shape[1] + new_tokens
    buffer = 1 << (total - 1).bit_length()  # room for the widest power-of-two context
    seq_BxL = jnp.zeros((prompt_BxT.shape[0], buffer), jnp.int32)
    seq_BxL = seq_BxL.at[:, : prompt_BxT.shape[1]].set(prompt_BxT)
    for length, width in schedule:
        step_rng = jax.random.fold_in(rng, length)
        seq_BxL = _naive_step(params, seq_BxL, length, step_rng, cfg=cfg, width=width)
    return jax.block_until_ready(seq_BxL[:, :total])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new_tokens", type=int, default=500)
    parser.add_argument("--prompt_len", type=int, default=1, help="nanoGPT samples from '\\n'")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--pos_encodings", nargs="+", default=["learned", "rope"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    print(f"backend={jax.default_backend()} devices={jax.devices()}")
    print(
        f"new_tokens={args.new_tokens} prompt_len={args.prompt_len} repeats={args.repeats} "
        "(median); random-init params; tokens/s counts new tokens over the whole batch"
    )
    print(f"{'positions':>10} {'batch':>5} {'cached tok/s':>13} {'naive tok/s':>12} {'speedup':>8}")
    rng = jax.random.key(0)
    for scheme in args.pos_encodings:
        cfg = SHAKESPEARE_CHAR.replace(pos_encoding=scheme)
        params = init_params(cfg, jax.random.key(1))
        for batch in args.batch_sizes:
            prompt_BxT = np.zeros((batch, args.prompt_len), np.int32)
            run = functools.partial(generate, params, cfg, prompt_BxT, args.new_tokens, rng=rng)
            cached = median_seconds(run, repeats=args.repeats)
            run = functools.partial(naive_generate, params, cfg, prompt_BxT, args.new_tokens, rng)
            naive = median_seconds(
                run, repeats=args.repeats, warm_up=functools.partial(run, warm_up=True)
            )
            tokens = batch * args.new_tokens
            print(
                f"{scheme:>10} {batch:>5} {tokens / cached:>13.0f} {tokens / naive:>12.0f} "
                f"{naive / cached:>7.1f}x"
            )


if __name__ == "__main__":
    main()
