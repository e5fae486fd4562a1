"""Registries: named tables of swappable parts, each entry one object, and `module:attr` for
user code kept outside the package.

A config key that picks a part (`optim.name`, `model.pos_encoding`, `model.attention_mask`,
...) holds either a name of its registry's table or `module:attr`, an attribute of a module
importable from the working directory or PYTHONPATH. So an experiment plugs in its own code
without a fork:

    minigpt-jax train --config configs/tiny.py --config.optim.name=my_opts:lion

An entry may declare the settings it reads (`declares`): they join the group of the config key
that picks it (`--config.<group>.<name>=`), are checked, listed, recorded and resumed like the
built-in ones (minigpt_jax.config_dict).

Every registry has one entry shape (`entry_class`, and/or a function of `arity` arguments)
normalised by one coercion (`Registry.coerce`), which refuses without calling it anything else
(a builtin such as `os:system`, a class, a constant); and a `contract(entry, probe_cfg)` run on a
small probe input before any work (`Registry.check_contract`): a wrong output shape or type is
refused naming the key, the `module:attr` and the contract. An exception raised by user code
(importing it or running it) is a `PluginError` (`plugin_error`): one header line naming the
config key and `module:attr`, then the frames of the user's own files. A run records the sha256
of every user module it imports (`user_module_digests`).

The package's registries are found by the config key that picks their entries through one
index, `REGISTRY_INDEX` (config key -> "module:NAME"), imported on first use (`REGISTRIES`);
a built-in entry kept in another module (a variant) is a `Builtin("module:NAME")` in its table.
So no registry fills by importing its consumers, and the default path imports no variant.

A leaf module: it imports nothing of minigpt_jax.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import linecache
import logging
import os
import sys
import traceback
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

Entry = TypeVar("Entry")


class RegistryError(ValueError):
    """A registry key that names no entry, or an entry that breaks its registry's contract;
    the message names the key and what an entry must be."""


class ContractError(Exception):
    """Raised by a registry's contract: the probe's output is not what the model needs."""


class PluginError(Exception):
    """An exception raised in user code: `header` names the config key and `module:attr`,
    `frames` the user's own frames (path:line and the source line), `note` (optional) what was
    kept and how to go on; `__cause__` the original."""

    def __init__(self, header: str, frames: list[str], note: str = ""):
        super().__init__(header)
        self.header, self.frames, self.note = header, frames, note

    def __str__(self) -> str:
        return "\n".join([self.header, *self.frames, *([self.note] if self.note else [])])


# Where each registry lives, by the config key that picks its entries: "module:NAME", imported
# on first use (`REGISTRIES`), so no module is imported for its registry to be found and a
# registry's consumers need not be imported first. The registries sit beside their entries.
REGISTRY_INDEX: dict[str, str] = {
    "model.pos_encoding": "minigpt_jax.model.positions:POSITION_ENCODINGS",
    "model.attention_mask": "minigpt_jax.model.attention_masks:ATTENTION_MASKS",
    "model.attention_score": "minigpt_jax.model.attention_scores:ATTENTION_SCORES",
    "model.norm": "minigpt_jax.model.layers:NORMS",
    "model.mlp": "minigpt_jax.model.blocks:MLPS",
    "model.block": "minigpt_jax.model.blocks:BLOCKS",
    "model.activation": "minigpt_jax.model.layers:ACTIVATIONS",
    "model.dense_grad": "minigpt_jax.model.speed.choices:DENSE_GRADS",
    "model.norm_grad": "minigpt_jax.model.speed.choices:NORM_GRADS",
    "model.matmul_dtype": "minigpt_jax.model.speed.choices:MATMUL_DTYPES",
    "model.attention": "minigpt_jax.model.speed.kernels:ATTENTION_KERNELS",
    "model.remat": "minigpt_jax.model.speed.choices:REMAT_POLICIES",
    "model.dtype": "minigpt_jax.model.config:DTYPES",
    "model.param_dtype": "minigpt_jax.model.config:PARAM_DTYPES",
    "model.parametrization": "minigpt_jax.model.parametrization:PARAMETRIZATIONS",
    "optim.name": "minigpt_jax.optimizers:OPTIMIZERS",
    "optim.schedule": "minigpt_jax.optimizers:SCHEDULES",
    "optim.eval_params": "minigpt_jax.optimizers:EVAL_PARAMS",
    "optim.gradient": "minigpt_jax.train.gradients:GRADIENTS",
    "data.corpus": "minigpt_jax.data.sources:CORPORA",
    "data.file_format": "minigpt_jax.data.corpus:FILE_FORMATS",
    "data.tokenizer": "minigpt_jax.data.tokenizers:TOKENIZERS",
    "data.format": "minigpt_jax.data.formats:DATA_FORMATS",
    "loss.terms": "minigpt_jax.model.loss_terms:LOSS_TERMS",
    "eval.metrics": "minigpt_jax.train.eval_metrics:METRICS",
    "step_metrics": "minigpt_jax.train.step_metrics:STEP_METRICS",
    "hooks.names": "minigpt_jax.train.hooks:HOOKS",
}


class _Registries(Mapping[str, "Registry"]):
    """{config key: Registry} of `REGISTRY_INDEX`, each imported on first use. Its keys are
    fixed, so walking it while an import runs (a user's entry importing a library module)
    never changes what is walked."""

    def __getitem__(self, config_key: str) -> Registry:
        return resolve_builtin(REGISTRY_INDEX[config_key])

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY_INDEX)

    def __len__(self) -> int:
        return len(REGISTRY_INDEX)


@functools.cache
def resolve_builtin(where: str) -> Any:
    """The object `NAME` of the package's module `module` for "module:NAME"."""
    module_name, _, name = where.partition(":")
    return getattr(importlib.import_module(module_name), name)


_NOT_BUILT_IN = object()  # `Registry.__getitem__`'s marker of a key with no built-in entry


@dataclasses.dataclass(frozen=True)
class Builtin:
    """A built-in entry that lives in another module ("module:NAME", e.g. a variant in
    minigpt_jax/model/variants/), imported when first picked: the registry's module names it
    without importing it, so the default path never imports the variants."""

    where: str


# Every registry by the config key that picks its entries (config_dict.py walks them).
REGISTRIES: Mapping[str, Registry] = _Registries()


class RegistryRef:
    """The registry of `config_key`, found through `REGISTRIES` when first asked: a setting's
    `choices` in a module that the registry's own module imports (GPTConfig's model group)."""

    def __init__(self, config_key: str):
        self.config_key = config_key

    def __contains__(self, key: object) -> bool:
        return key in REGISTRIES[self.config_key]

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRIES[self.config_key])

    def check(self, key: str) -> None:
        REGISTRIES[self.config_key].check(key)


# {module name: (file, [picking keys])} of every user module a registry key imported.
_USER_MODULES: dict[str, tuple[str | None, list[str]]] = {}


def declares(*options: type, **fields: Any) -> Callable[[Entry], Entry]:
    """Decorator: the entry reads these settings, held in one typed options object: a frozen
    dataclass whose fields are `settings.setting(default, doc, kind, **rules)`s (`declares(
    MyOptions)`), or those fields by name (`declares(window=setting(...))`, the short form: the
    dataclass is made here). The fields belong to the group of the config key that picks the
    entry; the entry reads them with `settings.options_of(group, entry)`. Works on functions,
    classes and (frozen) dataclass instances; returns the entry itself."""
    if len(options) > 1 or (options and fields):
        raise TypeError("declares takes one options dataclass, or settings by name, not both.")
    if options:
        _check_options_class(options[0])

    def attach(entry: Entry) -> Entry:
        earlier = options_class(entry)
        if options:
            if earlier not in (None, options[0]):
                raise TypeError(
                    f"{entry!r} already declares {earlier.__name__}: declare all its settings "
                    f"in one options dataclass."
                )
            made = options[0]
        else:  # the short form: a dataclass of these fields (and of any declared before)
            made = _options_class(entry, {**setting_fields(earlier), **fields})
        if isinstance(entry, type):  # a class, flax modules included: a class attribute
            entry.options_class = made
        else:  # object's own __setattr__ passes a frozen dataclass's guard
            object.__setattr__(entry, "options_class", made)
        return entry

    return attach


def _check_options_class(options: Any) -> None:
    """Raises TypeError unless `options` is a frozen dataclass whose every field is a setting."""
    if not (
        isinstance(options, type)
        and dataclasses.is_dataclass(options)
        and options.__dataclass_params__.frozen
        and len(setting_fields(options)) == len(dataclasses.fields(options))
    ):
        raise TypeError(
            f"declares: {options!r} is not a frozen dataclass whose fields are all "
            f"settings.setting(...)s."
        )


def _options_class(entry: Any, fields: dict[str, Any]) -> type:
    """A frozen dataclass of `fields` ({name: settings.setting field}), named after `entry`."""
    name = getattr(entry, "__name__", type(entry).__name__)
    made = dataclasses.make_dataclass(
        f"{name[:1].upper()}{name[1:]}Options",
        [
            (key, Any, dataclasses.field(default=field.default, metadata=field.metadata))
            for key, field in fields.items()
        ],
        frozen=True,
    )
    made.__module__ = getattr(entry, "__module__", None) or made.__module__
    return made


def options_class(entry: Any) -> type | None:
    """The options dataclass that `entry` declares (`declares`), or None."""
    found = getattr(entry, "options_class", None)
    return found if isinstance(found, type) and dataclasses.is_dataclass(found) else None


def declared_settings(entry: Any) -> dict[str, Any]:
    """{name: dataclasses.Field of settings.setting} that `entry` declares ({} if none)."""
    return setting_fields(options_class(entry))


def setting_fields(options: type | None) -> dict[str, Any]:
    """{name: dataclasses.Field of settings.setting} of an options dataclass ({} for None)."""
    if options is None:
        return {}
    return {
        field.name: field for field in dataclasses.fields(options) if "setting" in field.metadata
    }


def is_user_key(key: str) -> bool:
    """Whether `key` has the `module:attr` form of user code."""
    return ":" in key


def import_attr(key: str) -> Any:
    """The attribute `attr` of module `module` for key `module:attr` (raises ImportError or
    AttributeError, or whatever the module raises while it is imported). The working directory
    is searched too, as `python -m` would."""
    module_name, _, attr = key.partition(":")
    if not module_name or not attr:
        raise ImportError(f"{key!r} is not of the form module:attr")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # the console script does not put the working directory first
    module = importlib.import_module(module_name)
    value = module
    for part in attr.split("."):
        value = getattr(value, part)
    return value


# ----------------------------------------------------------------------------- plug-in errors


def is_user_file(filename: str) -> bool:
    """Whether a frame's file is user code: not the package, not an installed library, not
    the standard library."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # minigpt_jax/
    if path.startswith(package + os.sep) or "site-packages" in path or "dist-packages" in path:
        return False
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    return not path.startswith(stdlib + os.sep)


def _user_frames(error: BaseException) -> list[str]:
    """`  File "path", line N, in fn` and its source line for each frame of user code in the
    traceback (a SyntaxError's own location included)."""
    lines = []
    for frame in traceback.extract_tb(error.__traceback__):
        if is_user_file(frame.filename):
            lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
            source = frame.line or linecache.getline(frame.filename, frame.lineno).strip()
            if source:
                lines.append(f"    {source}")
    if isinstance(error, SyntaxError) and error.filename:
        lines.append(f'  File "{error.filename}", line {error.lineno}')
        if error.text:
            lines.append(f"    {error.text.strip()}")
    return lines


def _user_files() -> dict[str, list[str]]:
    """{real path of a user module's file: [picking keys]}."""
    return {
        os.path.realpath(file): keys for file, keys in _USER_MODULES.values() if file is not None
    }


def plugin_error(error: BaseException, *, where: str | None = None) -> PluginError | None:
    """A PluginError for `error` when it was raised in user code picked by a registry key (or
    `where` names the key), else None. Its header names the key(s) and the error."""
    frames = _user_frames(error)
    if where is None:
        files = _user_files()
        keys = [
            key
            for frame in traceback.extract_tb(error.__traceback__)
            for key in files.get(os.path.realpath(frame.filename), ())
        ]
        if isinstance(error, SyntaxError) and error.filename:
            keys += files.get(os.path.realpath(error.filename), [])
        if not keys:
            return None
        where = " and ".join(dict.fromkeys(keys[-1:]))  # the innermost user frame's key
    text = str(error).splitlines()[0] if str(error) else "no detail"
    header = f"error in user code of {where}: {type(error).__name__}: {text}"
    return PluginError(header, frames)


# jax logs an exception raised in a host callback (jax.pure_callback, io_callback,
# debug.callback) at length, then XLA raises a JaxRuntimeError whose traceback holds none of the
# user's frames: `host_callback_errors` keeps the original and silences the log.
_CALLBACK_LOGGERS = ("jax._src.callback", "jax._src.debugging")


class _KeepCallbackErrors(logging.Filter):
    def __init__(self):
        super().__init__()
        self.errors: list[BaseException] = []

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        self.errors.append(error)
        return False


@contextmanager
def host_callback_errors() -> Iterator[list[BaseException]]:
    """Within: the exceptions user code raises in jax host callbacks are collected in the list
    it yields (oldest first), not logged; `plugin_error` of one names its key and frames."""
    keep = _KeepCallbackErrors()
    loggers = [logging.getLogger(name) for name in _CALLBACK_LOGGERS]
    for logger in loggers:
        logger.addFilter(keep)
    try:
        yield keep.errors
    finally:
        for logger in loggers:
            logger.removeFilter(keep)


# ----------------------------------------------------------------------------- digests


def module_file(module_name: str) -> str | None:
    """The source file of a module (a package's __init__.py), None if it has none."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if file is None:
        spec = importlib.util.find_spec(module_name)
        file = spec.origin if spec is not None and spec.has_location else None
    return file


class SupportsToDict(Protocol):
    """A run config that gives its values as nested dicts: a ConfigDict, a typed Experiment."""

    def to_dict(self) -> dict[str, Any]: ...


def user_modules(config: Mapping[str, Any] | SupportsToDict) -> dict[str, list[str]]:
    """{module: ["optim.name='my_opts:lion'", ...]}: the user modules a config's `module:attr`
    keys import (config: a ConfigDict or nested dict), in the order the registries see them,
    each followed by the modules of the user's own it imports (`imported_user_modules`), which
    carry the keys of the plug-ins that import them."""
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    found: dict[str, list[str]] = {}
    for config_key, registry in REGISTRIES.items():
        node: Any = values
        for part in config_key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        for key in registry.keys_in(node):
            if is_user_key(key):
                module = key.partition(":")[0]
                for name in [module, *imported_user_modules(module)]:
                    found.setdefault(name, []).append(f"{config_key}={key!r}")
    return found


def imported_user_modules(module_name: str) -> list[str]:
    """The modules of the user's own (not the package's, an installed library's or the
    standard library's: `is_user_file`) that `module_name`'s source imports, at its top or
    inside a function, and those they import in turn. Read from the source (every import
    statement), so an import a function makes only when called counts too."""
    root = _source_file(module_name)
    if root is None or not is_user_file(root):
        return []  # a library's entry (optax:adamw): its imports are the library's
    found: list[str] = []
    seen, stack = {module_name}, [module_name]
    while stack:
        name = stack.pop()
        file = _source_file(name)
        if file is None:
            continue
        for imported in _imports_in(file, name):
            if imported in seen:
                continue
            seen.add(imported)
            imported_file = _source_file(imported)
            if imported_file is not None and is_user_file(imported_file):
                found.append(imported)
                stack.append(imported)
    return found


def _source_file(module_name: str) -> str | None:
    """The module's .py file, None for one that cannot be found or has none."""
    try:
        file = module_file(module_name)
    except (ImportError, ValueError):
        return None
    return file if file is not None and file.endswith(".py") and Path(file).is_file() else None


def _imports_in(file: str, module_name: str) -> list[str]:
    """The absolute module names the import statements of `file` (module `module_name`) name;
    `from a import b` gives a and a.b (b may be a submodule). [] for a file that does not parse."""
    try:
        tree = ast.parse(Path(file).read_bytes(), filename=file)
    except (SyntaxError, ValueError, OSError):
        return []
    is_package = os.path.basename(file) == "__init__.py"
    package = module_name if is_package else module_name.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            except (ImportError, ValueError):
                continue
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
    return names


def user_module_digests(config: Mapping[str, Any] | SupportsToDict) -> dict[str, str]:
    """{module: sha256 of its source file} of every user module a `module:attr` key of
    `config` imports and of every module of the user's own those import (a run's identity: a
    resume on edited plug-in code is refused). The digest is of the source bytes, comments
    included: the same on every Python version (bytecode is not), comparable with the digests
    runs already recorded, and a comment-only edit is told apart from none only by the flag
    that accepts it (--allow_resume_changes)."""
    digests = {}
    for module in user_modules(config):
        file = module_file(module)
        if file is not None and Path(file).is_file():
            digests[module] = hashlib.sha256(Path(file).read_bytes()).hexdigest()
    return digests


def changed_user_modules(recorded: dict[str, str]) -> list[str]:
    """The modules of `recorded` ({module: sha256}, a run's `user_module_digests`) whose
    source differs now ("module m (sha256 ab12.. -> cd34..)"), or that cannot be found."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # where a run found them (import_attr)
    changes = []
    for module, digest in sorted(recorded.items()):
        file = _source_file(module)
        now = hashlib.sha256(Path(file).read_bytes()).hexdigest() if file else None
        if now != digest:
            change = f"{digest[:12]} -> {now[:12]}" if now else "not found"
            changes.append(f"module {module} (sha256 {change})")
    return changes


# ----------------------------------------------------------------------------- the one coercion


def _is_function(value: Any) -> bool:
    """A function of Python code or a wrapper of one (functools.partial, jax.jit, custom_jvp,
    a callable instance): not a builtin, a class or a module."""
    if isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType)):
        return False
    if isinstance(value, functools.partial):
        return _is_function(value.func) or isinstance(value.func, types.BuiltinFunctionType)
    return callable(value) and not inspect.isbuiltin(value)


def _arity_problem(value: Any, arity: int) -> str | None:
    """None if `value` takes `arity` positional arguments, else what its signature is."""
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return None  # no signature to read (a C extension): the probe decides
    try:
        signature.bind(*range(arity))
    except TypeError:
        return f"its signature is {getattr(value, '__name__', 'it')}{signature}"
    return None


class Registry(Generic[Entry]):
    """A table of named entries of one kind of part.

    `registry[key]` is the entry for a table name or for `module:attr`. Entries have one shape:
    an instance of `entry_class`, or (arity given) a function of `arity` positional arguments,
    wrapped into `entry_class` when there is one (`shape` says it in words, for messages);
    `coerce` replaces that rule for a registry whose entries need another. `contract(entry,
    probe_cfg)` checks an entry on a small probe input, raising ContractError. `split` gives the
    keys one config value picks (loss.terms: several). Resolved user entries are cached, so a
    key imports its module once.
    """

    def __init__(
        self,
        kind: str,
        config_key: str,
        entries: dict[str, Entry] | None = None,
        *,
        entry_class: type | None = None,
        arity: int | None = None,
        shape: str = "",
        coerce: Callable[[Any], Entry] | None = None,
        contract: Callable[[Entry, Any], None] | None = None,
        split: Callable[[str], list[str]] | None = None,
        user_entries: bool = True,
    ):
        self.kind = kind  # e.g. "optimizer": used in messages
        self.config_key = config_key  # e.g. "optim.name": the setting that picks an entry
        self.entry_class, self.arity, self.contract = entry_class, arity, contract
        self.shape = shape or self._default_shape()
        self.user_entries = user_entries  # False: a fixed set of names (dtypes, remat policies)
        self._entries: dict[str, Entry] = dict(entries or {})
        self._coerce = coerce
        self._user: dict[str, Entry] = {}
        self._raw: dict[str, Any] = {}  # what a user key's module holds, before coercion
        self._split = split

    def _default_shape(self) -> str:
        parts = []
        if self.arity is not None:
            parts.append(f"a function of {self.arity} arguments")
        if self.entry_class is not None:
            parts.append(f"a {self.entry_class.__module__}.{self.entry_class.__qualname__}")
        return " or ".join(parts) or "an object"

    @property
    def group(self) -> str:
        """The settings group the picking key belongs to ("" for a top-level key)."""
        return self.config_key.rpartition(".")[0]

    def keys_in(self, value: Any) -> list[str]:
        """The entry keys a config value picks (one, or loss.terms' several)."""
        if not isinstance(value, str):
            return []
        return self._split(value) if self._split else [value]

    def options_classes_of(self, key: str) -> list[type]:
        """The options dataclasses (`declares`) of the entry picked by `key`: the entry's, what
        the user's module held, and those of the functions an entry dataclass holds
        (AttentionMask.fn, LossTerm.per_token), wherever `declares` put them. Raises
        RegistryError for a key that picks no entry."""
        entry = self[key]
        held = [value for value in getattr(entry, "__dict__", {}).values() if callable(value)]
        found = [options_class(value) for value in (entry, self._raw.get(key), *held)]
        return list(dict.fromkeys(cls for cls in found if cls is not None))

    def settings_of(self, key: str) -> dict[str, Any]:
        """{name: field} the entry picked by `key` declares (`declares`); raises RegistryError
        for a key that picks no entry."""
        found: dict[str, Any] = {}
        for cls in reversed(self.options_classes_of(key)):
            found.update(setting_fields(cls))
        return found

    def register(self, name: str, entry: Entry) -> Entry:
        """Adds `entry` under `name` (a library extending the table from Python)."""
        if is_user_key(name):
            raise ValueError(f"registry names may not contain ':' ({name!r} is the user form).")
        self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        return list(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if key in self._entries:
            return True
        try:
            self[key]
        except (RegistryError, PluginError):
            return False
        return True

    def coerce(self, value: Any) -> Entry:
        """The entry for what a user module holds; raises TypeError saying what it must be,
        without calling it."""
        if self._coerce is not None:
            return self._coerce(value)
        if self.entry_class is not None and isinstance(value, self.entry_class):
            return value
        if self.arity is not None and _is_function(value):
            problem = _arity_problem(value, self.arity)
            if problem:
                raise TypeError(f"{_a(self.kind)} entry must be {self.shape}, but {problem}.")
            return self.entry_class(value) if self.entry_class is not None else value
        raise TypeError(
            f"{_a(self.kind)} entry must be {self.shape}, got {_describe(value)}; it was not "
            "called."
        )

    def __getitem__(self, key: str) -> Entry:
        entry = self._entries.get(key, _NOT_BUILT_IN) if isinstance(key, str) else _NOT_BUILT_IN
        if entry is _NOT_BUILT_IN:
            return self._user_entry(key)
        if isinstance(entry, Builtin):  # a built-in named "module:NAME", imported when picked
            entry = self._entries[key] = resolve_builtin(entry.where)
        return entry

    def _user_entry(self, key: str) -> Entry:
        """The entry `module:attr` names (imported and checked once), or a RegistryError."""
        if not isinstance(key, str) or not is_user_key(key) or not self.user_entries:
            raise RegistryError(self._unknown(key))
        if key not in self._user:
            where = f"config.{self.config_key}={key!r}"
            module_name = key.partition(":")[0]
            try:
                value = import_attr(key)
            except ModuleNotFoundError as error:
                if error.name is not None and module_name.startswith(error.name):
                    raise RegistryError(self._unresolved(key, error)) from None
                raise _from_user(error, where) from error
            except AttributeError as error:
                if module_name in sys.modules:
                    self._note_module(module_name, key)
                plugin = plugin_error(error, where=where)
                if plugin.frames:  # raised by the module's own code
                    raise plugin from error
                raise RegistryError(self._unresolved(key, error)) from None
            except Exception as error:  # SyntaxError included: the module's own code
                raise _from_user(error, where) from error
            self._note_module(module_name, key)
            self._raw[key] = value
            try:
                self._user[key] = self.coerce(value)
            except TypeError as error:
                raise RegistryError(f"{where}: {error}") from None
        return self._user[key]

    def _note_module(self, module_name: str, key: str) -> None:
        file, keys = _USER_MODULES.get(module_name, (None, []))
        where = f"config.{self.config_key}={key!r}"
        if where not in keys:
            keys.append(where)
        _USER_MODULES[module_name] = (file or module_file(module_name), keys)

    def check(self, key: str) -> None:
        """Raises RegistryError when `key` picks no entry (before a run writes anything)."""
        self[key]

    def check_contract(self, key: str, probe_cfg: Any) -> None:
        """Runs the registry's contract on the entry `key` picks (a small probe input, before
        any work): raises RegistryError naming the key and the contract when the entry breaks
        it, PluginError when the entry's own code raises."""
        entry = self[key]
        if self.contract is None:
            return
        where = f"config.{self.config_key}={key!r}"
        try:
            self.contract(entry, probe_cfg)
        except ContractError as error:
            raise RegistryError(
                f"{where} breaks the {self.kind} contract: {error}; {_a(self.kind)} entry is "
                f"{self.shape}."
            ) from None
        except Exception as error:
            plugin = plugin_error(error, where=where)
            if not plugin.frames:
                raise RegistryError(
                    f"{where} fails on a probe input ({type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else 'no detail'}); "
                    f"{_a(self.kind)} entry is {self.shape}."
                ) from None
            raise plugin from error

    def _unknown(self, key: object) -> str:
        close = difflib.get_close_matches(str(key), self.names(), n=1)
        user = (
            ", or name your own code as module:attr (a module importable from the working "
            "directory or PYTHONPATH)."
            if self.user_entries
            else "."
        )
        return (
            f"config.{self.config_key}={key!r} is not a known {self.kind}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; the {_plural(self.kind)} are {', '.join(self.names())}{user}"
        )

    def _unresolved(self, key: str, error: Exception) -> str:
        return (
            f"config.{self.config_key}={key!r} names user code that cannot be loaded "
            f"({type(error).__name__}: {error}): put the module in the working directory or on "
            f"PYTHONPATH (a run trained with it needs it to resume, too), or pick one of the "
            f"{_plural(self.kind)} {', '.join(self.names())}."
        )


def _plural(kind: str) -> str:
    return kind[:-1] + "ies" if kind.endswith("y") else kind + "s"


def _a(kind: str) -> str:
    return ("an " if kind[:1] in "aeiou" else "a ") + kind


def _from_user(error: BaseException, where: str) -> PluginError:
    return plugin_error(error, where=where)


def _describe(value: Any) -> str:
    """What a refused value is, in words: its type, and which builtin or class it is."""
    kind = type(value).__name__
    if isinstance(value, types.BuiltinFunctionType):
        module = getattr(value, "__module__", None) or "builtins"
        return f"{kind} ({module}.{value.__name__}, a builtin)"
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    if isinstance(value, types.ModuleType):
        return f"the module {value.__name__}"
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def expect_shape(out: Any, shape: tuple[int, ...], what: str, *, dtype_kind: str = "") -> None:
    """Raises ContractError unless `out` (an array or jax.ShapeDtypeStruct) has `shape` (and a
    dtype of one of the numpy kinds in `dtype_kind`, e.g. "f" float, "b" bool); `what` names
    the output in the message."""
    got = getattr(out, "shape", None)
    if got is None:
        raise ContractError(f"{what} must be an array of shape {shape}, got {type(out).__name__}")
    if tuple(got) != tuple(shape):
        raise ContractError(f"{what} must have shape {tuple(shape)}, got {tuple(got)}")
    kind = getattr(getattr(out, "dtype", None), "kind", "")
    if dtype_kind and kind not in dtype_kind:
        raise ContractError(f"{what} must have a dtype of kind {dtype_kind!r}, got {out.dtype}")
