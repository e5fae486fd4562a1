"""Experiment configs (configs/*.py): the ConfigDict bridge to the declared settings, their
checks, and loading a config file.

A run config is an ml_collections ConfigDict with the loop settings at the top and the groups
`model`, `optim`, `data`, `mesh` and `loss`, every key declared once in `settings` (the model
group in `GPTConfig`); `default_config` holds every default, `complete` fills in what a config
file leaves out, and `gpt_config_from` turns the model group into the frozen `GPTConfig`.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import ml_collections
from jax.experimental import multihost_utils
from ml_collections import config_dict

from minigpt_jax import settings
from minigpt_jax.data import memory as data
from minigpt_jax.data import shards
from minigpt_jax.data.tokenizers import Tokenizer
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.losses import parse_terms
from minigpt_jax.registry import Registry
from minigpt_jax.settings import check_values, declarations
from minigpt_jax.train.optimizers import OPTIMIZERS, SCHEDULES

# The keys an experiment ConfigDict (configs/*.py) may hold, group by group, derived from the
# declarations (minigpt_jax.settings). vocab_size is not a model key: the tokenizer decides it
# (data.vocab_size sets the BPE size).
MODEL_KEYS = tuple(name for name in declarations(GPTConfig) if name != "vocab_size")
GROUP_SETTINGS: dict[str, type] = {"model": GPTConfig, **settings.GROUPS}
EXPERIMENT_KEYS: dict[str, tuple[str, ...]] = {
    "": (*declarations(settings.Loop), *GROUP_SETTINGS),
    "model": MODEL_KEYS,
    **{group: tuple(declarations(cls)) for group, cls in settings.GROUPS.items()},
}


def declaration(dotted: str) -> settings.Setting | None:
    """The declaration of the setting `group.key` (or a top-level `key`), None if unknown."""
    group, _, key = dotted.rpartition(".")
    cls = GROUP_SETTINGS.get(group) if group else settings.Loop
    return None if cls is None else declarations(cls).get(key)


def default_config() -> ml_collections.ConfigDict:
    """Every setting at its declared default: the ConfigDict a config file starts from."""
    config = ml_collections.ConfigDict(_defaults_of(settings.Loop))
    for group, cls in GROUP_SETTINGS.items():
        config[group] = ml_collections.ConfigDict(_defaults_of(cls))
    return config


def _defaults_of(cls: type) -> dict[str, Any]:
    specs = declarations(cls)
    return {
        # A None default becomes a typed placeholder, so `--config.data.path=x` parses as str.
        name: config_dict.placeholder(specs[name].type) if value is None else value
        for name, value in settings.defaults(cls).items()
        if name != "vocab_size" or cls is not GPTConfig
    }


def settings_table() -> str:
    """Every setting as `key  default  kind  doc`, group by group (`minigpt-jax settings`)."""
    lines = []
    for group, cls in (("", settings.Loop), *GROUP_SETTINGS.items()):
        lines.append(f"config.{group}" if group else "config")
        for name, spec in declarations(cls).items():
            if cls is GPTConfig and name == "vocab_size":
                continue
            default = settings.defaults(cls)[name]
            lines.append(f"  {name:<24} {default!r:<12} {spec.kind:<12} {spec.doc}")
    return "\n".join(lines)


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


def complete(config: Any) -> ml_collections.ConfigDict:
    """`config` over the declared defaults: a config file need only state what differs. Raises
    ValueError naming an unknown key (with "did you mean") or a group that is not a group."""
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    merged = default_config().to_dict()
    for key, value in values.items():
        if key not in EXPERIMENT_KEYS[""]:
            raise ValueError(unknown_key_message("", key))
        if key in GROUP_SETTINGS:
            if not isinstance(value, dict):
                raise ValueError(f"config.{key} must be a group of settings, got {value!r}.")
            for name, item in value.items():
                if name not in EXPERIMENT_KEYS[key]:
                    raise ValueError(unknown_key_message(key, name))
                merged[key][name] = item
        else:
            merged[key] = value
    return ml_collections.ConfigDict(merged)


def _check_values(config: ml_collections.ConfigDict) -> None:
    check_values(settings.Loop, {k: config[k] for k in declarations(settings.Loop)}, "config")
    for group, cls in settings.GROUPS.items():
        check_values(cls, config[group].to_dict(), f"config.{group}")


def _check_schedule(config: Any) -> None:
    k = config.steps_per_call
    for name in ("num_steps", "eval_every", "checkpoint_every"):
        value = config[name]
        if value % k:
            raise ValueError(
                f"config.{name}={value!r} must be a positive multiple of "
                f"steps_per_call={k}: steps run in chunks of {k}."
            )
    optim = config.optim
    if optim.schedule == "cosine" and optim.min_lr > optim.lr:
        raise ValueError(
            f"config.optim.min_lr={optim.min_lr!r} is above optim.lr={optim.lr!r}: the cosine "
            "schedule decays from lr to min_lr, so it would rise instead; set min_lr <= lr "
            "(e.g. lr / 10, or 0 with lr 0)."
        )
    if config.batch_size % config.grad_accum_steps:
        raise ValueError(
            f"config.batch_size={config.batch_size} (sequences per optimizer step) does not split "
            f"into grad_accum_steps={config.grad_accum_steps} equal micro-batches; use a "
            f"multiple of {config.grad_accum_steps}."
        )


def check_experiment_config(config: Any) -> ml_collections.ConfigDict:
    """The complete, checked config (`complete`'s): raises ValueError for an unknown key, a
    value its declaration does not allow (e.g. a negative lr; num_steps, eval_every and
    checkpoint_every must be multiples of steps_per_call), a registry key that picks no entry
    (optimizer, schedule, loss terms) or a model the model group cannot build; all before a run
    writes anything."""
    config = complete(config)
    _check_values(config)
    _check_schedule(config)
    OPTIMIZERS.check(config.optim.name)
    SCHEDULES.check(config.optim.schedule)
    data.CORPORA.check(config.data.corpus)
    data.TOKENIZERS.check(config.data.tokenizer)
    DATA_FORMATS.check(config.data.format)
    if config.data.file_format:
        data.FILE_FORMATS.check(config.data.file_format)
    parse_terms(config.loss.terms)
    GPTConfig(vocab_size=1, **config.model.to_dict())  # the tokenizer sets vocab_size later
    return config


def gpt_config_from(config: Any, vocab_size: int) -> GPTConfig:
    """The one bridge from an experiment ConfigDict to the frozen GPTConfig that jit sees
    (unknown model keys are errors; missing ones take their defaults)."""
    return GPTConfig(vocab_size=vocab_size, **complete({"model": config.model.to_dict()}).model)


def dataset_from(
    config: Any,
    workdir: str | Path | None,
    tokenizer: Tokenizer | None = None,
    *,
    progress: bool = False,
    before_writing: Callable[[], None] | None = None,
    check_data: Callable[[data.DataDigest], None] | None = None,
) -> data.Dataset:
    """The run's tokenizer and token splits as its data group describes them, cached in
    `workdir` (a resumed or re-read run finds its own tokenizer and tokens there), by the entry
    of DATA_FORMATS that data.format picks: held in RAM ("memory"), or memory-mapped from
    shards prepared on first use ("shards"). A given `tokenizer` (a pretrained model's)
    replaces data.tokenizer and data.vocab_size. check_data(digest) sees the digest of the
    token stream the run will train on once it is known, and before_writing() is called once
    the data checks have passed; both come before the first write, so a check_data that raises
    leaves every data file as it was."""
    return DATA_FORMATS[config.data.format](
        config,
        workdir,
        tokenizer,
        progress=progress,
        before_writing=before_writing,
        check_data=check_data,
    )


def _memory_dataset(config, workdir, tokenizer, *, progress, before_writing, check_data):
    del progress  # one call; nothing to show
    return data.prepare_dataset(
        config.data.corpus,
        config.data.path,
        config.data.tokenizer,
        config.data.vocab_size,
        config.model.block_size,
        workdir,
        config.data.val_fraction,
        tokenizer=tokenizer,
        text_field=config.data.text_field,
        file_format=config.data.file_format,
        data=config.data,
        before_writing=before_writing,
        check_data=check_data,
    )


def _sharded_dataset(config, workdir, tokenizer, *, progress, before_writing, check_data):
    if workdir is None:
        raise ValueError("data.format 'shards' needs a workdir to keep its tokenizer in.")
    prepare = functools.partial(
        shards.sharded_dataset,
        config.data,
        config.model.block_size,
        workdir,
        tokenizer=tokenizer,
        before_writing=before_writing,
        check_data=check_data,
    )
    if jax.process_count() > 1:
        # One process prepares the shards in the shared folder while the others wait;
        # then every process maps them (and a host without that folder prepares its own).
        if jax.process_index() == 0:
            prepare(progress=progress)
        multihost_utils.sync_global_devices("minigpt_jax: shards prepared")
    return prepare(progress=progress and jax.process_index() == 0)


def _as_data_format(value: Any) -> Callable[..., data.Dataset]:
    if not callable(value) or isinstance(value, type):
        raise TypeError(
            "a data format is a function (config, workdir, tokenizer, *, progress, "
            f"before_writing, check_data) -> data.Dataset, not {type(value).__name__}."
        )
    return value


# How a run holds its tokens (data.format): each entry a function (config, workdir,
# tokenizer, *, progress, before_writing, check_data) -> data.Dataset, as dataset_from calls it.
DATA_FORMATS = Registry(
    "data format",
    "data.format",
    {"memory": _memory_dataset, "shards": _sharded_dataset},
    coerce=_as_data_format,
)


# The built-in configs, shipped in the package (minigpt_jax/configs/*.py).
PACKAGED_CONFIGS = Path(__file__).resolve().parent / "configs"


def packaged_config_names() -> list[str]:
    return sorted(p.stem for p in PACKAGED_CONFIGS.glob("*.py") if p.stem != "__init__")


def config_file_of(spec: str) -> str:
    """The `path[:arg]` a --config value names: a file as given; else a built-in config by
    name (`tiny`, `tiny:arg`) or by the repository's path (`configs/tiny.py`, which then works
    from any folder) as the packaged file."""
    path, sep, arg = spec.partition(":")
    if Path(path).is_file():
        return spec
    name = Path(path).stem if path.endswith(".py") else path
    parent = Path(path).parent.name
    if name in packaged_config_names() and (
        (path == name) or (path.endswith(".py") and parent == "configs")
    ):
        return f"{PACKAGED_CONFIGS / name}.py{sep}{arg}"
    return spec


def add_config_root_to_path(config_path: str) -> None:
    """Configs import their siblings as `from configs import default`: puts the folder above
    the config file's folder on sys.path, wherever the command runs from."""
    root = str(Path(config_path).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)


def load_config_file(spec: str) -> Any:
    """get_config(arg) of a config file given as `path[:arg]` (or a built-in config's name:
    `config_file_of`), as the CLI's --config reads it."""
    path, _, arg = config_file_of(spec).partition(":")
    add_config_root_to_path(path)
    module_spec = importlib.util.spec_from_file_location("_minigpt_jax_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)


def config_file_problem(spec: str) -> str | None:
    """None if the config file `path[:arg]` loads and its get_config(arg) returns a ConfigDict;
    else one line saying what is wrong (a syntax error, no get_config, get_config raising or
    returning something else), for the command line to print instead of a traceback."""
    spec = config_file_of(spec)
    path, _, arg = spec.partition(":")
    if not Path(path).is_file():
        return (
            f"--config {path}: no such file; give a config file such as my_config.py, or a "
            f"built-in config by name: {', '.join(packaged_config_names())}."
        )
    try:
        config = load_config_file(spec)
    except SyntaxError as error:
        return f"{path}, line {error.lineno}: {error.msg}; fix the config file's syntax."
    except AttributeError as error:
        if "get_config" not in str(error):
            return f"{path} failed to load ({type(error).__name__}: {error})."
        return (
            f"{path} defines no get_config(); a config file defines get_config(arg=None) "
            "returning an ml_collections.ConfigDict (see configs/tiny.py)."
        )
    except Exception as error:  # the config file's own code
        line = str(error).splitlines()[0] if str(error) else "no detail"
        return f"{path}: get_config({arg or None!r}) raised {type(error).__name__}: {line}; fix it."
    if not isinstance(config, ml_collections.ConfigDict):
        return (
            f"{path}: get_config() returned {type(config).__name__}, not an "
            "ml_collections.ConfigDict; return the config (see configs/tiny.py)."
        )
    return None
