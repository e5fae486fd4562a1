"""Per-step training metrics: the registry `STEP_METRICS`, picked by `config.step_metrics`.

An entry is one function `(grads, updates, params) -> {name: float32 scalar}` over the step's
gradients (before clipping), the optimizer's updates and the params before the update, all
pytrees of the params' structure. It runs inside the compiled step, every step, and its values
are logged beside the loss (metrics.jsonl every step, TensorBoard every log_every) without the
loop naming them. Parameters are told apart by what their creation site declares
(`param_meta.tags_of`), never by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from minigpt_jax.model import param_meta
from minigpt_jax.settings.registry import ContractError, Registry, RegistryError
from minigpt_jax.train.metrics import EVALUATION_PREFIXES, RECORD_KEYS, reserved_key

Params = Any
StepMetricFn = Callable[[Params, Params, Params], dict[str, Any]]
UNTAGGED = "untagged"


def _tag_groups(tree: Params) -> dict[str, list[Any]]:
    """{tag: [leaves]}: each leaf under every tag it declares, or under "untagged"."""
    groups: dict[str, list[Any]] = {}

    def add(path, leaf):
        for tag in param_meta.tags_of(path, leaf) or (UNTAGGED,):
            groups.setdefault(tag, []).append(leaf)

    jax.tree_util.tree_map_with_path(add, tree)
    return groups


def grad_norm_by_tag(grads: Params, updates: Params, params: Params) -> dict[str, Any]:
    """grad_norm_<tag>: the global norm of the gradients of each tag's parameters (embedding,
    attention, mlp, head, a plug-in's own; norm scales and biases without tags: untagged)."""
    del updates, params
    return {
        f"grad_norm_{tag}": optax.tree.norm(leaves) for tag, leaves in _tag_groups(grads).items()
    }


def update_ratio(grads: Params, updates: Params, params: Params) -> dict[str, Any]:
    """update_ratio: |update| / |params| over all parameters, the step's relative change."""
    del grads
    return {"update_ratio": optax.tree.norm(updates) / optax.tree.norm(params)}


def _metric_contract(fn: StepMetricFn, config: object) -> None:
    """fn(grads, updates, params) returns a dict of scalars, on a two-parameter tree."""
    del config
    tree = {
        "w": jax.ShapeDtypeStruct((3, 2), jnp.float32),
        "b": jax.ShapeDtypeStruct((2,), jnp.float32),
    }
    probe = param_meta.ParamMeta(decay=True, tags=("probe",))
    with param_meta.using({("w",): probe}):
        out = jax.eval_shape(fn, tree, tree, tree)
    if not isinstance(out, dict) or any(getattr(v, "shape", None) != () for v in out.values()):
        raise ContractError(f"it returned {out!r}, not a dict of scalars")
    for name in out:
        problem = _name_problem(name)
        if problem:
            raise ContractError(f"{problem}; rename it")


def _name_problem(name: Any) -> str | None:
    """Why a step metric may not log under `name` (a key the run's record writes), or None."""
    if not isinstance(name, str):
        return f"it logs under {name!r}, not a str"
    what = reserved_key(name)
    if what is None:
        return None
    return (
        f"it logs {name!r}, a key the run's record writes ({what}; a plug-in may not log "
        f"{', '.join(RECORD_KEYS)}, {', '.join(p + '*' for p in EVALUATION_PREFIXES)})"
    )


def _metric_keys(spec: str) -> list[str]:
    return [item.strip() for item in spec.split(",") if item.strip()]


STEP_METRICS: Registry[StepMetricFn] = Registry(
    "step metric",
    "step_metrics",
    {"grad_norm_by_tag": grad_norm_by_tag, "update_ratio": update_ratio},
    arity=3,
    shape="a function (grads, updates, params) -> {name: scalar}",
    contract=_metric_contract,
    split=_metric_keys,
)


def parse_step_metrics(spec: str) -> tuple[str, ...]:
    """`config.step_metrics` as a tuple of keys, each resolved (raises naming an unknown one)."""
    keys = tuple(_metric_keys(spec))
    for key in keys:
        STEP_METRICS[key]  # noqa: B018 (resolves it, or raises naming the entries)
    return keys


def step_metric_values(
    keys: tuple[str, ...], grads: Params, updates: Params, params: Params, taken: set[str]
) -> dict[str, Any]:
    """{name: scalar} of every picked entry; raises RegistryError (one line, naming the key) for
    a name that the run's record, the step (`taken`: its loss terms' values) or another metric
    already logs: found while the step is traced, before training."""
    values: dict[str, Any] = {}
    for key in keys:
        for name, value in STEP_METRICS[key](grads, updates, params).items():
            problem = _name_problem(name)
            if problem is None and (name in values or name in taken):
                problem = f"it logs {name!r}, which the step or another metric already logs"
            if problem:
                raise RegistryError(f"config.step_metrics={key!r}: {problem}; rename it.")
            values[name] = jnp.asarray(value, jnp.float32)
    return values
