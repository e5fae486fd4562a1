"""Experiment configs (configs/*.py): the ConfigDict bridge to the declared settings, their
checks, and loading a config file.

A run config is an ml_collections ConfigDict with the loop settings at the top and the groups
`model`, `optim`, `data`, `mesh` and `loss`, every key declared once in `settings` (the model
group in `GPTConfig`); `default_config` holds every default, `complete` fills in what a config
file leaves out, and `gpt_config_from` turns the model group into the frozen `GPTConfig`.
A run reads the typed experiment built from it once (typed_config.build_experiment).
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

import ml_collections
from ml_collections import config_dict

from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.loss_terms import parse_terms
from minigpt_jax.settings import groups as settings
from minigpt_jax.settings.groups import check_values, declarations
from minigpt_jax.settings.registry import (
    REGISTRIES,
    REGISTRY_INDEX,
    PluginError,
    RegistryError,
    is_user_key,
)
from minigpt_jax.settings.shape_schedule import ShapeSchedule

# The keys an experiment ConfigDict (configs/*.py) may hold, group by group, derived from the
# declarations (minigpt_jax.settings.groups). vocab_size is not a model key: the tokenizer
# decides it (data.vocab_size sets the BPE size).
MODEL_KEYS = tuple(name for name in declarations(GPTConfig) if name != "vocab_size")
GROUP_SETTINGS: dict[str, type] = {"model": GPTConfig, **settings.GROUPS}
EXPERIMENT_KEYS: dict[str, tuple[str, ...]] = {
    "": (*declarations(settings.Loop), *GROUP_SETTINGS),
    "model": MODEL_KEYS,
    **{group: tuple(declarations(cls)) for group, cls in settings.GROUPS.items()},
}


# A run config as a config file gives it: a ConfigDict, or the same values as nested dicts.
RunConfig: TypeAlias = ml_collections.ConfigDict | Mapping[str, Any]


def declaration(dotted: str, config: RunConfig | None = None) -> settings.Setting | None:
    """The declaration of the setting `group.key` (or a top-level `key`), None if unknown;
    with `config`, the settings its picked entries declare count too."""
    group, _, key = dotted.rpartition(".")
    cls = GROUP_SETTINGS.get(group) if group else settings.Loop
    found = None if cls is None else declarations(cls).get(key)
    if found is None and config is not None:
        field = entry_settings(_as_dict(config)).get(group, {}).get(key)
        found = field[0].metadata["setting"] if field else None
    return found


# ----------------------------------------------------------------------------- entry settings


def _as_dict(config: RunConfig) -> dict:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def picked_entries(values: dict) -> list[tuple[Any, str]]:
    """(registry, key) of every entry the config's values pick (a registry key the config does
    not hold takes its declared default)."""
    picks = []
    for config_key, registry in REGISTRIES.items():
        group, _, name = config_key.rpartition(".")
        node = values.get(group) if group else values
        if not isinstance(node, dict) or name not in node:
            spec = declaration(config_key)
            if spec is None:
                continue
            node = {name: settings.defaults(GROUP_SETTINGS.get(group, settings.Loop))[name]}
        picks.extend((registry, key) for key in registry.keys_in(node[name]))
    return picks


def entry_settings(values: dict) -> dict[str, dict[str, tuple[Any, str]]]:
    """{group: {name: (field, "optim.name='mod:attr'")}}: the settings the picked entries
    declare (registry.declares), in the group of the key that picks each. Raises ValueError for
    a name that clashes with a built-in setting of the group, or that two entries declare
    differently. A key that picks no entry is skipped (the checks name it)."""
    found: dict[str, dict[str, tuple[Any, str]]] = {}
    for registry, key in picked_entries(values):
        try:
            declared = registry.settings_of(key)
        except (RegistryError, PluginError):
            continue
        group = registry.group
        for name, field in declared.items():
            where = f"config.{registry.config_key}={key!r}"
            if name in EXPERIMENT_KEYS.get(group, ()) or name in ("vocab_size", "entry_settings"):
                raise ValueError(
                    f"{where} declares a setting {name!r}, which clashes with the built-in "
                    f"config.{group}.{name}: rename the entry's setting (e.g. "
                    f"{key.rpartition(':')[2]}_{name})."
                )
            previous = found.setdefault(group, {}).get(name)
            if previous is not None and (previous[0].default, previous[0].metadata) != (
                field.default,
                field.metadata,
            ):
                raise ValueError(
                    f"config.{group}.{name} is declared differently by {previous[1]} and by "
                    f"{where}: rename one of them."
                )
            found[group].setdefault(name, (field, where))
    return {group: names for group, names in found.items() if names}


def add_entry_settings(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> None:
    """Adds to `config` (in place) the settings its picked entries declare, at their defaults,
    so that `--config.<group>.<name>=` overrides find them; `overrides` ({dotted key: text} of
    the command line) may pick other entries than the file does. Problems are left for the
    checks to name."""
    values = _as_dict(config)
    for dotted, text in overrides.items():
        if dotted in REGISTRIES:
            group, _, name = dotted.rpartition(".")
            node = values.setdefault(group, {}) if group else values
            if isinstance(node, dict):
                node[name] = text
    try:
        declared = entry_settings(values)
    except ValueError:
        return
    with config.unlocked():
        for group, names in declared.items():
            if group not in config:
                config[group] = ml_collections.ConfigDict()
            node = config[group]
            for name, (field, _) in names.items():
                if name not in node:
                    spec = field.metadata["setting"]
                    default = field.default
                    node[name] = config_dict.placeholder(spec.type) if default is None else default


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


def settings_table(config: RunConfig | None = None) -> str:
    """Every setting as `key  default  kind  doc`, group by group (`minigpt-jax settings`),
    each group followed by the settings its built-in entries declare. With `config`, the
    values of that (completed) config instead of the defaults, and the settings of the
    entries it picks."""
    lines, last = [], None
    for group, name, value, kind, doc in settings_rows(config):
        if group != last:
            lines.append(f"config.{group}" if group else "config")
            last = group
        lines.append(f"  {name:<24} {value!r:<12} {kind:<12} {doc}")
    return "\n".join(lines)


def settings_rows(config: RunConfig | None = None) -> list[tuple[str, str, Any, str, str]]:
    """(group, key, value, kind, doc) of every setting, as `settings_table` lists them (the
    documentation site's table is made from these too)."""
    if config is not None:
        config = complete(config)
        declared = entry_settings(config.to_dict())
    else:
        declared = _builtin_entry_settings()
    rows = []
    for group, cls in (("", settings.Loop), *GROUP_SETTINGS.items()):
        node = config if config is None or not group else config[group]
        for name, spec in declarations(cls).items():
            if cls is GPTConfig and name == "vocab_size":
                continue
            value = settings.defaults(cls)[name] if config is None else node[name]
            rows.append((group, name, value, spec.kind, spec.doc + _entries_note(group, name)))
        for name, (field, where) in declared.get(group, {}).items():
            spec = field.metadata["setting"]
            value = field.default if config is None else node[name]
            rows.append((group, name, value, spec.kind, f"{spec.doc} ({where})"))
    return rows


def _entries_note(group: str, name: str) -> str:
    """ " [built-in: a | b | ...]" for a key that picks entries of a registry, so the table shows
    what a user may pick besides module:attr; "" for any other setting."""
    config_key = f"{group}.{name}" if group else name
    if config_key not in REGISTRY_INDEX:
        return ""
    return f" [built-in: {' | '.join(REGISTRIES[config_key].names())}]"


def _builtin_entry_settings() -> dict[str, dict[str, tuple[Any, str]]]:
    """The settings every built-in entry declares, by group (for the defaults' table)."""
    found: dict[str, dict[str, tuple[Any, str]]] = {}
    for config_key, registry in REGISTRIES.items():
        for name in registry.names():
            for setting_name, field in registry.settings_of(name).items():
                where = f"with {config_key}={name!r}"
                found.setdefault(registry.group, {}).setdefault(setting_name, (field, where))
    return found


def unknown_key_message(path: str, key: str, extra: tuple[str, ...] = ()) -> str:
    """Names an unknown config key `path.key` and lists the valid keys at that level (`extra`:
    the picked entries' own settings)."""
    valid = (*EXPERIMENT_KEYS.get(path, ()), *extra)
    close = difflib.get_close_matches(key, valid, n=1)
    where = f"config.{path}" if path else "config"
    return (
        f"unknown config key {where}.{key}"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + f"; valid keys of {where}: {', '.join(valid)}."
    )


def complete(config: RunConfig) -> ml_collections.ConfigDict:
    """`config` over the declared defaults: a config file need only state what differs. Raises
    ValueError naming an unknown key (with "did you mean") or a group that is not a group."""
    values = _as_dict(config)
    merged = default_config().to_dict()
    others: dict[tuple[str, str], Any] = {}  # keys the picked entries may declare
    for key, value in values.items():
        if key not in EXPERIMENT_KEYS[""]:
            raise ValueError(unknown_key_message("", key))
        if key in GROUP_SETTINGS:
            if not isinstance(value, dict):
                raise ValueError(f"config.{key} must be a group of settings, got {value!r}.")
            for name, item in value.items():
                if name in EXPERIMENT_KEYS[key]:
                    merged[key][name] = item
                else:
                    others[key, name] = item
        else:
            merged[key] = value
    declared = entry_settings(merged)
    for group, name in others:
        if name not in declared.get(group, {}):
            raise ValueError(unknown_key_message(group, name, tuple(declared.get(group, ()))))
    for group, names in declared.items():
        for name, (field, _) in names.items():
            merged[group][name] = others.get((group, name), field.default)
    return ml_collections.ConfigDict(merged)


def _check_values(config: ml_collections.ConfigDict) -> None:
    check_values(settings.Loop, {k: config[k] for k in declarations(settings.Loop)}, "config")
    for group, cls in settings.GROUPS.items():
        check_values(cls, config[group].to_dict(), f"config.{group}")
    for group, names in entry_settings(config.to_dict()).items():
        for name, (field, where) in names.items():
            message = field.metadata["setting"].problem(
                f"config.{group}.{name}", config[group][name]
            )
            if message:
                raise ValueError(f"{message} (a setting of {where})")


def _check_schedule(config: RunConfig) -> None:
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
    ShapeSchedule.of(config)  # seq_len_schedule and batch_size_schedule


def check_experiment_config(config: RunConfig) -> ml_collections.ConfigDict:
    """The complete, checked config (`complete`'s): raises ValueError for an unknown key, a
    value its declaration does not allow (e.g. a negative lr; num_steps, eval_every and
    checkpoint_every must be multiples of steps_per_call), a registry key that picks no entry
    (optimizer, schedule, loss terms) or a model the model group cannot build; all before a run
    writes anything."""
    return checked_config(config)[0]


def checked_config(config: RunConfig) -> tuple[ml_collections.ConfigDict, GPTConfig]:
    """(the complete, checked config, its model group typed with vocab_size 1: the tokenizer
    sets it later); the checks of `check_experiment_config`."""
    config = complete(config)
    _check_values(config)
    _check_schedule(config)
    for registry, key in picked_entries(config.to_dict()):
        choices = getattr(declaration(registry.config_key), "choices", None)
        if choices is None or key not in choices:  # e.g. model.attention's "auto"
            registry.check(key)  # every key that picks an entry, checked by its registry
    parse_terms(config.loss.terms, config.loss)
    model = _gpt_config(config, vocab_size=1)
    check_entries(config, model)
    return config, model


def check_entries(config: ml_collections.ConfigDict, model: GPTConfig) -> None:
    """Runs each picked user entry (`module:attr`) on its registry's contract's small probe
    input (registry.Registry.check_contract), before any work: a model entry sees `model` (the
    config's model group) with a vocabulary of 16, the others their typed group, as a run
    hands it to them (the top level's see the config)."""
    for registry, key in picked_entries(config.to_dict()):
        if not is_user_key(key) or registry.contract is None:
            continue
        if registry.group == "model":
            registry.check_contract(key, model.replace(vocab_size=16))
        else:
            registry.check_contract(key, typed_group(config, registry.group))


def typed_group(config: ml_collections.ConfigDict, group: str) -> Any:
    """Group `group` of the complete config as its typed settings.Group (the config itself for
    the top level, "")."""
    if not group:
        return config
    return GROUP_SETTINGS[group].from_values(config[group].to_dict())


def gpt_config_from(config: RunConfig, vocab_size: int) -> GPTConfig:
    """The one bridge from an experiment ConfigDict to the frozen GPTConfig that jit sees
    (unknown model keys are errors; missing ones take their defaults; the picked entries' own
    settings go to GPTConfig.entry_settings)."""
    return _gpt_config(complete({"model": config.model.to_dict()}), vocab_size)


def _gpt_config(config: ml_collections.ConfigDict, vocab_size: int) -> GPTConfig:
    model = config.model.to_dict()
    own = {name: model.pop(name) for name in list(model) if name not in MODEL_KEYS}
    return GPTConfig(vocab_size=vocab_size, entry_settings=tuple(own.items()), **model)


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


# Modules renamed or moved out of the library (issue 35): named in the error a config file
# gets when it still imports one (a sweep's trial configs import the sweep's space).
_MOVED_MODULES = {
    "minigpt_jax.sweep": "minigpt_apps.sweep",
    "minigpt_jax.compare": "minigpt_apps.compare",
    "minigpt_jax.lab": "minigpt_apps.lab",
    "minigpt_jax.experiment": "minigpt_jax.config_dict",
    "minigpt_jax.loading": "minigpt_jax.model_files",
    "minigpt_jax.data.storage": "minigpt_jax.data.formats",
    "minigpt_jax.sampling.settings": "minigpt_jax.sampling.options",
    "minigpt_jax.step_metrics": "minigpt_jax.train.step_metrics",
    "minigpt_jax.hooks": "minigpt_jax.train.hooks",
    "minigpt_jax.model.attention_fns": "minigpt_jax.model.attention",
    "minigpt_jax.model.losses": "minigpt_jax.model.gpt",
    "minigpt_jax.model.dense": "minigpt_jax.model.layers",
    "minigpt_jax.model.eval_metrics": "minigpt_jax.train.eval_metrics",
    "minigpt_jax.checkpoint": "minigpt_jax.runtime.checkpoint",
}


def _moved_module(name: str) -> str | None:
    """Where module `name` lives now, if it is one that moved (or a module inside one)."""
    for old, new in _MOVED_MODULES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


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
    except ModuleNotFoundError as error:
        moved = _moved_module(error.name or "")
        if moved is None:
            return f"{path} failed to load (ModuleNotFoundError: {error})."
        return (
            f"{path} imports {error.name}, which is {moved} since the library and its apps "
            f"were reorganised (no old module paths are kept at 0.1.0): replace the import's "
            f"module in the file (a sweep's or a comparison's config files: every config.py "
            "and best_config.py it wrote), then rerun."
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
