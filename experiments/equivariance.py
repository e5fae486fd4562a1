"""Experiment 6: attention is permutation-equivariant until positions (or a mask) break it.

    python -m experiments.equivariance --outdir results/equivariance

For the full GPT (`forward`, dropout 0) we permute the sequence and print the max abs
difference ‖f(x[p]) - f(x)[p]‖∞ of the logits, bidirectional (`causal=False`) and causal, with
none / learned / sinusoidal / rope positions. At the N(0, 0.02²) init the attention is nearly
uniform, so rope, which acts only through the attention scores, barely shows (~0.01);
learned and sinusoidal vectors are added to the residual stream and show at once. To make
attention itself non-trivial every kernel and embedding table is also scaled by 10 (std 0.2;
LayerNorm untouched). Each number is the max over three seeds.

Only "bidirectional + no positions" is equivariant: the causal mask alone tells positions apart.
What the causal model does keep, checked numerically:
  * prefix property: permuting the tokens after t leaves the outputs at positions <= t unchanged
    (all schemes, any depth: that is causality);
  * set of the past: without positions, a ONE-layer causal model's output at t depends on the
    token at t and the set of earlier tokens, not their order. With two or more layers this
    fails: the second layer's keys at s < t already depend on their own prefixes.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import make_parser, new_figure, print_table, save_figure
from minigpt_jax import GPTConfig, forward, init_params

SCHEMES = ("none", "learned", "sinusoidal", "rope")
SEEDS = (0, 1, 2)
SCALE = 10.0


def scale_weights(params, factor: float):
    """Multiply every kernel and embedding table by `factor` (biases, LayerNorm untouched)."""

    def scale(path, leaf):
        return leaf * factor if path[-1].key in ("kernel", "embedding") else leaf

    return jax.tree_util.tree_map_with_path(scale, params)


@functools.cache
def _init_learned(cfg: GPTConfig, seed: int):
    return init_params(cfg.replace(pos_encoding="learned", causal=True), jax.random.key(seed))


def model_params(cfg: GPTConfig, seed: int):
    """init_params(cfg, key(seed)), from one cached init per depth and seed.

    Flax derives each param's key from its path, so the learned model's params minus its
    position table are the arrays a fresh init of any other scheme gives (checked in
    tests/test_experiments.py): every scheme and mask shares one set of weights per seed.
    """
    params = dict(_init_learned(cfg, seed))
    if cfg.pos_encoding != "learned":
        params["embed"] = {"tok": params["embed"]["tok"]}
    return params


def max_change(model, tokens_BxT: np.ndarray, perm_T: np.ndarray, watched=slice(None)):
    """(max |f(x[:, p]) - f(x)[:, p]| over the `watched` positions, max |f(x)|)."""
    logits_BxTxV = model(tokens_BxT)
    permuted_BxTxV = model(tokens_BxT[:, perm_T])
    change = np.abs(permuted_BxTxV[:, watched] - logits_BxTxV[:, perm_T][:, watched]).max()
    return float(change), float(np.abs(logits_BxTxV).max())


def run(
    outdir: Path | None = None,
    *,
    cfg: GPTConfig | None = None,
    batch: int = 2,
    length: int = 16,
    seeds=SEEDS,
    scale: float = SCALE,
) -> dict:
    """Permutation errors per scheme and mask, and the two causal properties.

    cfg defaults to the mini-GPT (4 layers, D=128) with dropout 0.
    """
    cfg = (cfg or GPTConfig()).replace(dropout=0.0)

    def trial(model_cfg: GPTConfig, seed: int, weight_scale: float):
        """(logits function, tokens_BxT, rng) of one seed."""
        params = scale_weights(model_params(model_cfg, seed), weight_scale)
        rng = np.random.default_rng(seed)
        tokens_BxT = rng.integers(0, cfg.vocab_size, (batch, length))
        # Eager on purpose: the many configs share one cache of per-op compiles.
        return (lambda x: np.asarray(forward(params, jnp.asarray(x), model_cfg))), tokens_BxT, rng

    def full_permutation(model_cfg: GPTConfig, seed: int, weight_scale: float):
        model, tokens_BxT, rng = trial(model_cfg, seed, weight_scale)
        return max_change(model, tokens_BxT, rng.permutation(length))

    # ---- full permutations
    full = {}
    rows = []
    for causal in (False, True):
        for scheme in SCHEMES:
            scheme_cfg = cfg.replace(pos_encoding=scheme, causal=causal)
            at_init = [full_permutation(scheme_cfg, s, 1.0) for s in seeds]
            scaled = [full_permutation(scheme_cfg, s, scale) for s in seeds]
            full[(causal, scheme)] = max(e for e, _ in scaled)
            mask = "causal" if causal else "bidirectional"
            rows.append([mask, scheme, *np.max(at_init, axis=0), *np.max(scaled, axis=0)])
    print_table(
        f"‖f(x[p]) - f(x)[p]‖∞ of the logits, random permutation p of T={length} "
        f"(max over seeds {list(seeds)})",
        ["attention", "positions", "init: error", "max|logit|", f"x{scale:g}: error", "max|logit|"],
        rows,
    )

    # ---- what the causal model keeps
    t = length // 2

    def permute_after_t(model_cfg: GPTConfig, seed: int) -> float:
        """Permute the tokens after t; max change of the logits at positions <= t."""
        model, tokens_BxT, rng = trial(model_cfg, seed, scale)
        perm_T = np.concatenate([np.arange(t + 1), t + 1 + rng.permutation(length - t - 1)])
        return max_change(model, tokens_BxT, perm_T, slice(0, t + 1))[0]

    def permute_before_t(model_cfg: GPTConfig, seed: int) -> float:
        """Permute the tokens before t; max change of the logits at t."""
        model, tokens_BxT, rng = trial(model_cfg, seed, scale)
        perm_T = np.concatenate([rng.permutation(t), np.arange(t, length)])
        return max_change(model, tokens_BxT, perm_T, slice(t, t + 1))[0]

    prefix = {}
    past_set = {}
    for scheme in SCHEMES:
        scheme_cfg = cfg.replace(pos_encoding=scheme, causal=True)
        prefix[scheme] = max(permute_after_t(scheme_cfg, s) for s in seeds)
        for n_layer in sorted({1, cfg.n_layer}):
            layer_cfg = scheme_cfg.replace(n_layer=n_layer)
            past_set[(scheme, n_layer)] = max(permute_before_t(layer_cfg, s) for s in seeds)
    print_table(
        f"causal model, x{scale:g} weights, t={t}: max logit change under partial permutations",
        [
            "positions",
            f"permute after t: change at <= t, N={cfg.n_layer}",
            "permute before t: change at t, N=1",
            f"same, N={cfg.n_layer}",
        ],
        [[s, prefix[s], past_set[(s, 1)], past_set[(s, cfg.n_layer)]] for s in SCHEMES],
    )

    fig, axes = new_figure(1, 2, size=(11.0, 4.0))
    floor = 1e-9  # log axes cannot show an exact 0: such bars are drawn at the floor, labelled 0
    full_series = {
        "bidirectional": [full[(False, s)] for s in SCHEMES],
        "causal": [full[(True, s)] for s in SCHEMES],
    }
    causal_series = {
        "permute after t: change at <= t": [prefix[s] for s in SCHEMES],
        "permute before t: change at t, N=1": [past_set[(s, 1)] for s in SCHEMES],
        f"permute before t: change at t, N={cfg.n_layer}": [
            past_set[(s, cfg.n_layer)] for s in SCHEMES
        ],
    }
    panels = (
        (axes[0, 0], f"Full permutation (weights x{scale:g})", full_series),
        (axes[0, 1], f"Causal model, partial permutations (t={t})", causal_series),
    )
    x = np.arange(len(SCHEMES))
    for ax, title, series in panels:
        width = 0.8 / len(series)
        for i, (label, values) in enumerate(series.items()):
            offsets = x + (i - (len(series) - 1) / 2) * width
            ax.bar(offsets, [max(v, floor) for v in values], width, label=label)
            for offset, value in zip(offsets, values, strict=True):
                if value == 0:
                    ax.text(offset, floor, "0", ha="center", va="bottom")
        ax.set_yscale("log")
        ax.set_ylim(floor / 3, 1e5)
        ax.set_xticks(x, SCHEMES)
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize=8, ncol=len(series) if len(series) < 3 else 1)
    axes[0, 0].set_ylabel("max abs change of the logits")
    figure = save_figure(fig, outdir, "equivariance")

    return dict(full=full, prefix=prefix, past_set=past_set, figures=[figure])


def main(argv=None):
    args = make_parser("equivariance", __doc__).parse_args(argv)
    run(args.outdir)


if __name__ == "__main__":
    main()
