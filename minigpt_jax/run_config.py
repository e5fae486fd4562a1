"""Experiment configs (configs/*.py): the keys a run config may hold, their checks, and loading
a config file.

A run config is an ml_collections ConfigDict with the loop settings at the top and the groups
`model`, `optim`, `data` and `mesh`; `gpt_config_from` turns its model group into the frozen
`GPTConfig`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import jax
from jax.experimental import multihost_utils

from minigpt_jax import data, shards
from minigpt_jax.config import GPTConfig
from minigpt_jax.tokenizers import Tokenizer

DATA_FORMATS = ("memory", "shards")

# The keys an experiment ConfigDict (configs/*.py) may hold, group by group. vocab_size is not a
# model key: the tokenizer decides it (data.vocab_size sets the BPE size).
MODEL_KEYS = tuple(f.name for f in dataclasses.fields(GPTConfig) if f.name != "vocab_size")
EXPERIMENT_KEYS: dict[str, tuple[str, ...]] = {
    "": (
        "seed",
        "batch_size",
        "grad_accum_steps",
        "num_steps",
        "steps_per_call",
        "eval_every",
        "eval_batches",
        "log_every",
        "checkpoint_every",
        "keep_checkpoints",
        "init_from",
        "model",
        "optim",
        "data",
        "mesh",
    ),
    "model": MODEL_KEYS,
    "optim": ("lr", "min_lr", "warmup_steps", "b1", "b2", "eps", "weight_decay", "grad_clip"),
    "data": (
        "corpus",
        "path",
        "tokenizer",
        "vocab_size",
        "val_fraction",
        "format",
        "shards_dir",
        "text_field",
        "shard_tokens",
        "tokenizer_sample_bytes",
    ),
    "mesh": ("data", "fsdp", "tensor"),
}


def unknown_key_message(path: str, key: str) -> str:
    """Names an unknown config key `path.key` and lists the valid keys at that level."""
    valid = EXPERIMENT_KEYS.get(path, ())
    close = difflib.get_close_matches(key, valid, n=1)
    where = f"config.{path}" if path else "config"
    return (
        f"unknown config key {where}.{key}"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + f"; valid keys of {where}: {', '.join(valid)}."
    )


def _check_keys(config: Any, path: str) -> None:
    valid = EXPERIMENT_KEYS[path]
    group = config if not path else config.get(path)
    if group is None:
        raise ValueError(f"the config has no group {path!r}; it needs {', '.join(valid)}.")
    for key in group.keys():
        if key not in valid:
            raise ValueError(unknown_key_message(path, key))
    missing = [k for k in valid if k not in group]
    if missing:
        where = f"config.{path}" if path else "config"
        raise ValueError(f"{where} lacks {', '.join(missing)}: start from configs/default.py.")


def _check_schedule(config: Any) -> None:
    k = config.steps_per_call
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"config.steps_per_call must be a positive integer, got {k!r}.")
    for name in ("num_steps", "eval_every", "checkpoint_every"):
        value = config[name]
        if not isinstance(value, int) or value < 1 or value % k:
            raise ValueError(
                f"config.{name}={value!r} must be a positive multiple of "
                f"steps_per_call={k}: steps run in chunks of {k}."
            )
    for name in ("batch_size", "grad_accum_steps", "eval_batches", "log_every", "keep_checkpoints"):
        if not isinstance(config[name], int) or config[name] < 1:
            raise ValueError(f"config.{name} must be a positive integer, got {config[name]!r}.")
    if config.batch_size % config.grad_accum_steps:
        raise ValueError(
            f"config.batch_size={config.batch_size} (sequences per optimizer step) does not split "
            f"into grad_accum_steps={config.grad_accum_steps} equal micro-batches; use a "
            f"multiple of {config.grad_accum_steps}."
        )
    if config.data.format not in DATA_FORMATS:
        raise ValueError(
            f"config.data.format={config.data.format!r} is unknown; choose one of "
            f"{list(DATA_FORMATS)}."
        )


# (name, lowest allowed, whether the lowest itself is allowed, the bound it must stay below)
_OPTIM_RANGES = (
    ("lr", 0.0, True, None),  # 0 is allowed: a run that only evaluates or checks a model
    ("min_lr", 0.0, True, None),
    ("warmup_steps", 0, True, None),
    ("b1", 0.0, True, 1.0),
    ("b2", 0.0, True, 1.0),
    ("eps", 0.0, False, None),
    ("weight_decay", 0.0, True, None),
    ("grad_clip", 0.0, False, None),
)


def _check_optim(optim: Any) -> None:
    for name, low, low_ok, high in _OPTIM_RANGES:
        value = optim[name]
        kind = int if name == "warmup_steps" else (int, float)
        if (
            isinstance(value, bool)
            or not isinstance(value, kind)
            or not math.isfinite(value)
            or value < low
            or (value == low and not low_ok)
            or (high is not None and value >= high)
        ):
            allowed = f"{'>=' if low_ok else '>'} {low}" + (f" and < {high}" if high else "")
            raise ValueError(
                f"config.optim.{name}={value!r} is out of range: it must be "
                f"{'an integer' if kind is int else 'a finite number'} {allowed}."
            )


def check_experiment_config(config: Any) -> None:
    """Raises ValueError for a missing or unknown key in an experiment ConfigDict, a loop
    setting that is not a positive integer (num_steps, eval_every and checkpoint_every must be
    multiples of steps_per_call), an optimizer setting out of range (e.g. a negative lr) or a
    model the model group cannot build; all before a run writes anything."""
    for path in EXPERIMENT_KEYS:
        _check_keys(config, path)
    _check_schedule(config)
    _check_optim(config.optim)
    GPTConfig(vocab_size=1, **config.model.to_dict())  # the tokenizer sets vocab_size later


def gpt_config_from(config: Any, vocab_size: int) -> GPTConfig:
    """The one bridge from an experiment ConfigDict to the frozen GPTConfig that jit sees
    (checks the model group's keys; `check_experiment_config` checks the rest)."""
    _check_keys(config, "model")
    return GPTConfig(vocab_size=vocab_size, **config.model.to_dict())


def dataset_from(
    config: Any,
    workdir: str | Path | None,
    tokenizer: Tokenizer | None = None,
    *,
    progress: bool = False,
) -> data.Dataset:
    """The run's tokenizer and token splits as its data group describes them, cached in
    `workdir` (a resumed or re-read run finds its own tokenizer and tokens there): held in RAM
    (data.format "memory"), or memory-mapped from shards prepared on first use ("shards"). A
    given `tokenizer` (a pretrained model's) replaces data.tokenizer and data.vocab_size."""
    if config.data.format == "shards":
        if workdir is None:
            raise ValueError("data.format 'shards' needs a workdir to keep its tokenizer in.")
        prepare = functools.partial(
            shards.sharded_dataset,
            config.data,
            config.model.block_size,
            workdir,
            tokenizer=tokenizer,
        )
        if jax.process_count() > 1:
            # One process prepares the shards in the shared folder while the others wait;
            # then every process maps them (and a host without that folder prepares its own).
            if jax.process_index() == 0:
                prepare(progress=progress)
            multihost_utils.sync_global_devices("minigpt_jax: shards prepared")
        return prepare(progress=progress and jax.process_index() == 0)
    return data.prepare_dataset(
        config.data.corpus,
        config.data.path,
        config.data.tokenizer,
        config.data.vocab_size,
        config.model.block_size,
        workdir,
        config.data.val_fraction,
        tokenizer=tokenizer,
    )


def add_config_root_to_path(config_path: str) -> None:
    """Configs import their siblings as `from configs import default`: puts the folder above
    the config file's folder on sys.path, wherever the command runs from."""
    root = str(Path(config_path).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)


def load_config_file(spec: str) -> Any:
    """get_config(arg) of a config file given as `path[:arg]`, as the CLI's --config reads it."""
    path, _, arg = spec.partition(":")
    add_config_root_to_path(path)
    module_spec = importlib.util.spec_from_file_location("_minigpt_jax_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)
