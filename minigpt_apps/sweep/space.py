"""What a sweep fixes and what it searches: `--set key=value` and `--space key=SPEC` parsed,
typed by each setting's declared type and checked against the config before anything is
written, and the config file a trial (or the best trial) trains.

A SPEC is a list of values (`model.norm=layernorm,rmsnorm`, `optim.lr=1e-3,3e-3`) or a range
with a scale: `log:1e-4..3e-2` (float, log scale), `float:0..1`, `int:200..2000`,
`int:log:16..256`. Every problem is a ValueError of one line naming the argument and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path
from typing import Any

from minigpt_jax.config_dict import (
    EXPERIMENT_KEYS,
    check_experiment_config,
    declaration,
    load_config_file,
    unknown_key_message,
)

_RANGE = re.compile(r"^(log|float|int|int:log):([^.][^:]*?)\.\.([^:]+)$")


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One searched key: `values` (a list) or a range low..high of `kind` int or float."""

    key: str
    values: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    kind: str | None = None  # "int" | "float" for a range
    log: bool = False

    def describe(self) -> dict[str, Any]:
        """The dimension as plain data (part of the study's identity)."""
        if self.values is not None:
            return {"values": list(self.values)}
        return {"kind": self.kind, "low": self.low, "high": self.high, "log": self.log}

    def distribution(self):
        """The Optuna distribution of this dimension."""
        import optuna

        if self.values is not None:
            return optuna.distributions.CategoricalDistribution(self.values)
        if self.kind == "int":
            return optuna.distributions.IntDistribution(int(self.low), int(self.high), log=self.log)
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log)


def base_config(spec: str):
    """get_config(arg) of the `--config path[:arg]` file (a one-line error if it fails)."""
    from minigpt_jax.config_dict import config_file_problem

    problem = config_file_problem(spec)
    if problem:
        raise ValueError(problem)
    return load_config_file(spec)


def _split(argument: str, flag: str) -> tuple[str, str]:
    key, sep, value = argument.partition("=")
    key = key.strip()
    if not sep or not key or not value.strip():
        example = "optim.lr=log:1e-4..3e-2" if flag == "--space" else "num_steps=200"
        raise ValueError(f"{flag} {argument!r}: write key=value, e.g. {flag} {example}.")
    return key, value.strip()


def _existing(config, key: str) -> tuple[bool, Any]:
    """(whether `key` names a value of the config file's own config, that value)."""
    node = config
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            return False, None
        node = node[part]
    return True, node


def _type_of(config, key: str) -> tuple[type, Any]:
    """(the setting's type, its declaration or None): a declared setting, or a key the config
    holds (an entry's own setting, typed by its value); else the "did you mean" error."""
    spec = declaration(key)
    if spec is not None:
        return spec.type, spec
    found, value = _existing(config, key)
    if found and not hasattr(value, "keys"):
        return (type(value) if value is not None else str), None
    raise ValueError(_unknown_key(config, key))


def _unknown_key(config, key: str) -> str:
    """The "did you mean" line of an unknown `key`: the valid keys of its group (the picked
    entries' own settings too), or, when its group is none, the keys and groups of config."""
    path, _, name = key.rpartition(".")
    if path not in EXPERIMENT_KEYS:  # train.steps, nosuch.key: no such group
        head, _, rest = key.partition(".")
        if head in EXPERIMENT_KEYS:  # model.norm.x: a setting is no group
            return f"unknown config key config.{key}: config.{path} is not a group of settings."
        line = unknown_key_message("", head)  # "unknown config key config.HEAD ...; valid ..."
        return line.replace(f"config.{head}", f"config.{head} (in {key})", 1)
    found, group = _existing(config, path) if path else (True, config)
    own = tuple(k for k in (group.keys() if found and hasattr(group, "keys") else ())
                if k not in EXPERIMENT_KEYS[path])  # fmt: skip
    return unknown_key_message(path, name, own)


def typed(config, key: str, text: str) -> Any:
    """`text` as a value of the setting `key`, by its declared type; checked by its rule."""
    kind, spec = _type_of(config, key)
    if text in ("None", "none", "null") and spec is not None and spec.nullable:
        return None
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError
            value: Any = lowered in ("true", "1")
        elif kind is int:
            value = int(text)
        elif kind is float:
            value = float(text)
        else:
            value = text
    except ValueError:
        words = {bool: "true or false", int: "an integer", float: "a number"}[kind]
        raise ValueError(f"{key}={text!r}: {key} is {words}; give one.") from None
    if spec is not None:
        problem = spec.problem(f"config.{key}", value)
        if problem:
            raise ValueError(problem)
    return value


def parse_sets(config, arguments: list[str]) -> dict[str, Any]:
    """`--set key=value` arguments as {key: typed value}; a key given twice is refused."""
    values: dict[str, Any] = {}
    for argument in arguments:
        key, text = _split(argument, "--set")
        if key in values:
            raise ValueError(f"--set {key} is given twice; keep one.")
        values[key] = typed(config, key, text)
    return values


def parse_space(config, arguments: list[str], fixed: dict[str, Any]) -> list[Dimension]:
    """`--space key=SPEC` arguments as Dimensions; refuses a key given twice or also --set, a
    repeated value, a single value, a range on a setting of another type, an empty range."""
    dimensions: dict[str, Dimension] = {}
    for argument in arguments:
        key, spec = _split(argument, "--space")
        if key in dimensions:
            raise ValueError(f"--space {key} is given twice; give all its values in one --space.")
        if key in fixed:
            raise ValueError(f"{key} is both --set and --space; drop one of them.")
        kind, _ = _type_of(config, key)
        dimensions[key] = _dimension(config, key, spec, kind)
    if not dimensions:
        raise ValueError(
            "give at least one --space key=SPEC, e.g. --space optim.lr=log:1e-4..3e-2."
        )
    return list(dimensions.values())


_INT_EXAMPLE = "200..2000"


def _dimension(config, key: str, spec: str, kind: type) -> Dimension:
    match = _RANGE.match(spec)
    if match is None:
        if ".." in spec:
            raise ValueError(
                f"--space {key}={spec}: a range names its scale: log:A..B, float:A..B, "
                "int:A..B or int:log:A..B."
            )
        try:
            values = [typed(config, key, v.strip()) for v in spec.split(",")]
        except ValueError as error:
            if kind not in (int, float):
                raise
            example = f"int:{_INT_EXAMPLE}" if kind is int else "log:1e-4..1e-2"
            raise ValueError(
                f"{error} Search it by listing values (a,b,c) or by a range with its scale, "
                f"e.g. --space {key}={example} (log:A..B, float:A..B, int:A..B, int:log:A..B)."
            ) from None
        if len(values) < 2:
            raise ValueError(f"--space {key}={spec} has one value; use --set {key}={spec}.")
        repeated = sorted({repr(v) for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(f"--space {key}={spec} repeats {', '.join(repeated)}; list it once.")
        return Dimension(key, values=tuple(values))
    scale, low_text, high_text = match.groups()
    is_int = scale.startswith("int")
    if kind is bool or kind is str:
        raise ValueError(f"--space {key}={spec}: {key} is not a number; list its values.")
    if kind is int and not is_int:
        raise ValueError(f"--space {key}={spec}: {key} is an integer; write int:{spec}.")
    if kind is float and is_int:
        raise ValueError(f"--space {key}={spec}: {key} is a float; write float:A..B or log:A..B.")
    low, high = typed(config, key, low_text.strip()), typed(config, key, high_text.strip())
    log = scale in ("log", "int:log")
    if not low < high:
        raise ValueError(f"--space {key}={spec}: the range is empty; write low..high, low < high.")
    if log and low <= 0:
        raise ValueError(f"--space {key}={spec}: a log range starts above 0; raise its low end.")
    return Dimension(key, low=low, high=high, kind="int" if is_int else "float", log=log)


def check_space(config_spec: str, fixed: dict[str, Any], space: list[Dimension]) -> None:
    """Checks the config with the fixed values alone, then with each value of each dimension
    (a list's values, a range's two ends), so a bad one is refused before the study starts."""
    check_experiment_config(config_with(config_spec, fixed))
    for dimension in space:
        for value in dimension.values or (dimension.low, dimension.high):
            try:
                check_experiment_config(config_with(config_spec, {**fixed, dimension.key: value}))
            except ValueError as error:
                raise ValueError(f"--space {dimension.key}={value!r}: {error}") from None


def config_with(config_spec: str, values: dict[str, Any]):
    """The `path[:arg]` config file's get_config(arg) with each dotted key set to its value:
    what a trial's (and the best trial's) config file returns."""
    import ml_collections

    config = load_config_file(config_spec)
    for dotted, value in values.items():
        *groups, name = dotted.split(".")
        node = config
        for group in groups:
            if group not in node:
                node[group] = ml_collections.ConfigDict()
            node = node[group]
        node[name] = value
    return config


def config_file_text(config_spec: str, values: dict[str, Any], doc: str) -> str:
    """A config file whose get_config() is `config_with(config_spec, values)`, runnable as
    `minigpt-jax train --config FILE` from anywhere (the base config by absolute path)."""
    path, sep, arg = config_spec.partition(":")
    spec = str(Path(path).resolve()) + (sep + arg if sep else "")
    lines = [f"    {k!r}: {v!r}," for k, v in values.items()]
    return (
        f'"""{doc}"""\n\n'
        "from minigpt_apps.sweep.space import config_with\n\n"
        f"BASE = {spec!r}\n"
        "VALUES = {\n" + "\n".join(lines) + "\n}\n\n\n"
        "def get_config(arg=None):\n"
        "    return config_with(BASE, VALUES)\n"
    )


def file_digest(config_spec: str) -> str:
    return hashlib.sha256(Path(config_spec.partition(":")[0]).read_bytes()).hexdigest()
