"""μP's coordinate check (Yang et al. 2022, section 7 and appendix; microsoft/mup's coord
check): train a few steps at several widths under each parametrization and record the mean
|coordinate| of the embedding's output, each block's output and the logits. Under μP they stay
flat in the width; under the standard parametrization with Adam they grow with it, since a
hidden matrix's update moves each output coordinate by about lr · fan-in.

`coord_check` returns the scales and, per parametrization and layer, the least-squares slope of
log(mean |x|) against log(width) after the last step: about 0 under μP, about 1 for the blocks
and the logits under the standard parametrization.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from minigpt_apps.scale.width_runs import (
    DEFAULT_FAMILY,
    Family,
    activation_scales,
    batches,
    layer_names,
    log_log_slope,
    make_step,
    optimizer,
)
from minigpt_jax.model.gpt import init_params
from minigpt_jax.settings.groups import Optim

PARAMETRIZATIONS = ("standard", "mup")


@dataclasses.dataclass(frozen=True)
class CoordCheck:
    """scales[parametrization][layer]: mean |x| per width (seed mean), after each step
    (steps + 1 rows: row 0 at init), widths across; slopes[parametrization][layer]: the
    log-log slope after the last step."""

    widths: tuple[int, ...]
    steps: int
    lr: float
    scales: dict[str, dict[str, np.ndarray]]
    slopes: dict[str, dict[str, float]]

    def table(self) -> list[list]:
        """Rows (parametrization, layer, mean |x| per width after the last step..., slope)."""
        return [
            [name, layer, *self.scales[name][layer][-1], self.slopes[name][layer]]
            for name in self.scales
            for layer in self.scales[name]
        ]


def coord_check(
    widths: Sequence[int] = (64, 128, 256, 512),
    *,
    family: Family = DEFAULT_FAMILY,
    steps: int = 4,
    lr: float = 1e-2,
    seeds: Sequence[int] = (0, 1),
    parametrizations: Sequence[str] = PARAMETRIZATIONS,
) -> CoordCheck:
    """The coordinate check: `steps` Adam updates (AdamW at a constant rate `lr`, no weight
    decay, global-norm clipping at 1) of `family` at each width under each parametrization,
    mean |x| measured on a fixed batch at init and after each update, averaged over `seeds`
    (each seed its own init and batches)."""
    if len(widths) < 2 or len(set(widths)) != len(widths):
        raise ValueError(f"coord_check needs two or more distinct widths, got {list(widths)}.")
    optim = Optim(schedule="constant", warmup_steps=0, weight_decay=0.0)
    probe_BxT = batches(family, 1, seed=10_000)[0, :, :-1]  # one batch no run trains on
    layers = layer_names(family)
    scales: dict[str, dict[str, np.ndarray]] = {}
    for name in parametrizations:
        by_width = np.zeros((len(layers), steps + 1, len(widths)))
        for w, width in enumerate(widths):
            cfg = family.config(width, name)
            # The constant schedule's step 0 is its warmup's rate 0: one more step, and the
            # scales are read after each of the `steps` updates that move the params.
            tx, _ = optimizer(cfg, optim, steps + 1)
            step = make_step(cfg, tx)
            for seed in seeds:
                params = init_params(cfg, jax.random.key(seed))
                opt_state = tx.init(params)
                data = batches(family, steps + 1, seed)
                params, opt_state, _ = step(params, opt_state, data[0], lr)  # rate 0
                for t in range(steps + 1):
                    if t:
                        params, opt_state, _ = step(params, opt_state, data[t], lr)
                    measured = activation_scales(params, probe_BxT, cfg)
                    by_width[:, t, w] += [measured[layer] / len(seeds) for layer in layers]
        scales[name] = {layer: by_width[i] for i, layer in enumerate(layers)}
    slopes = {
        name: {layer: log_log_slope(widths, values[-1]) for layer, values in by_layer.items()}
        for name, by_layer in scales.items()
    }
    return CoordCheck(tuple(widths), steps, lr, scales, slopes)
