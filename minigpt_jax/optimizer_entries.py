"""The built-in optimizer and schedule entries that are not the default's, named in
`optimizers.OPTIMIZERS` and `optimizers.SCHEDULES` (`Builtin`) and imported only when picked:
Muon (`muon`; its parts in minigpt_jax/muon.py), the warmup-constant and warmup-stable-decay
schedules.
"""

from __future__ import annotations

import jax
import optax

from minigpt_jax.model.param_meta import decay_mask
from minigpt_jax.model.speed import backend
from minigpt_jax.muon import (
    is_dimension_numbers,
    muon_dimension_numbers,
    scale_by_muon,
    scale_by_width,
)
from minigpt_jax.optimizer_plugins import optim_setting
from minigpt_jax.settings.groups import AUTO, Optim


def muon_ns_dtype(optim: Optim) -> str:
    """optim.muon_ns_dtype resolved, once, when the optimizer is built: "auto" is "bfloat16" on a
    CPU with a bfloat16 dot unit (`backend.bf16_matmuls_pay`), else "float32"."""
    choice = optim_setting(optim, "muon_ns_dtype")
    return choice if choice != AUTO else backend.training_matmul_dtype()


def muon(optim: Optim, learning_rate: optax.Schedule) -> optax.GradientTransformation:
    """Muon (Jordan et al. 2024) on the blocks' matrices, AdamW on the rest: optax.contrib.muon
    with its defaults, its Newton-Schulz dots on optim.muon_ns_dtype operands (`muon_ns_dtype`).

    The matrices' learning rate is optim.muon_lr on the same schedule shape as optim.lr's (the
    embeddings, head, biases and norms keep AdamW at optim.lr, b1, b2, eps 1e-8 and Nesterov, as
    optax.contrib.muon); Nesterov momentum optim.muon_momentum; decoupled decay
    optim.weight_decay on `decay_mask`'s leaves, Muon's and AdamW's alike (optax.contrib.muon
    decays every AdamW leaf: a norm scale or bias declaring no decay is left undecayed here).
    """
    ratio = optim.muon_lr / optim.lr if optim.lr else 0.0

    def labels(params):  # Muon's leaves by their dimension numbers, AdamW's by None
        dims = muon_dimension_numbers(params)
        return jax.tree.map(
            lambda d: "adam" if d is None else "muon", dims, is_leaf=is_dimension_numbers
        )

    muon_transform = optax.chain(
        scale_by_muon(
            muon_dimension_numbers,
            beta=optim.muon_momentum,
            operand_dtype=muon_ns_dtype(optim),
        ),
        scale_by_width(muon_dimension_numbers),
        optax.add_decayed_weights(optim.weight_decay, decay_mask),
        optax.scale_by_learning_rate(lambda step: learning_rate(step) * ratio),
    )
    # optax.adamw's chain with the decay on decay_mask's leaves only, its state as adamw's
    # without a mask (earlier Muon checkpoints restore into it; Muon's own part keeps
    # optax.masked's decay above for the same reason: its state is what they hold).
    adam = optax.chain(
        optax.scale_by_adam(b1=optim.b1, b2=optim.b2, eps=1e-8, nesterov=True),
        decay_where_declared(optim.weight_decay),
        optax.scale_by_learning_rate(learning_rate),
    )
    return optax.partition({"muon": muon_transform, "adam": adam}, labels)


def decay_where_declared(weight_decay: float) -> optax.GradientTransformation:
    """optax.add_decayed_weights (u + weight_decay * p) on `decay_mask`'s leaves, the others as
    they are, with add_decayed_weights' unmasked state (optax.masked would wrap it in another)."""

    def update(updates, state, params):
        if weight_decay == 0.0:
            return updates, state
        decayed = jax.tree.map(
            lambda u, p, decay: u + weight_decay * p if decay else u,
            updates,
            params,
            decay_mask(params),
        )
        return decayed, state

    return optax.GradientTransformation(optax.init_empty_state, update)


def warmup_constant(optim: Optim, num_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to optim.lr, then constant (min_lr unused)."""
    del num_steps
    return optax.linear_schedule(0.0, optim.lr, max(optim.warmup_steps, 1))


def warmup_stable_decay(optim: Optim, num_steps: int) -> optax.Schedule:
    """Warmup-stable-decay ("trapezoidal"; Hägele et al. 2024, the NanoGPT speedrun): linear
    warmup to optim.lr, constant, then linear decay to optim.min_lr over the last
    optim.decay_fraction of num_steps."""
    warmup = optim.warmup_steps
    decay = max(int(round(optim.decay_fraction * num_steps)), 1)
    stable_end = max(num_steps - decay, warmup)
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, optim.lr, max(warmup, 1)),
            optax.constant_schedule(optim.lr),
            optax.linear_schedule(optim.lr, optim.min_lr, decay),
        ],
        [warmup, stable_end],
    )
