"""Registries: named tables of swappable parts, each entry one object, and `module:attr` for
user code kept outside the package.

A config key that picks a part (`optim.name`, `model.pos_encoding`, `model.attention_mask`,
...) holds either a name of its registry's table or `module:attr`, an attribute of a module
importable from the working directory or PYTHONPATH. So an experiment plugs in its own code
without a fork:

    minigpt-jax train --config configs/tiny.py --config.optim.name=my_opts:lion

An entry may declare the settings it reads (`declares`): they join the group of the config key
that picks it (`--config.<group>.<name>=`), are checked, listed, recorded and resumed like the
built-in ones (minigpt_jax.run_config).

A leaf module: it imports nothing of minigpt_jax.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

Entry = TypeVar("Entry")


class RegistryError(ValueError):
    """A registry key that names no entry; the message lists the entries and the user form."""


# Every registry by the config key that picks its entries (run_config walks them).
REGISTRIES: dict[str, Registry] = {}


def declares(**fields: Any) -> Callable[[Entry], Entry]:
    """Decorator: the entry reads these settings, each a `settings.setting(default, doc, kind,
    **rules)`; they belong to the group of the config key that picks the entry. Works on
    functions, classes and (frozen) dataclass instances; returns the entry itself."""

    def attach(entry: Entry) -> Entry:
        merged = {**(getattr(entry, "settings", None) or {}), **fields}
        object.__setattr__(entry, "settings", merged)
        return entry

    return attach


def declared_settings(entry: Any) -> dict[str, Any]:
    """{name: dataclasses.Field of settings.setting} that `entry` declares ({} if none)."""
    found = getattr(entry, "settings", None)
    if not isinstance(found, dict):
        return {}
    return {
        name: field
        for name, field in found.items()
        if hasattr(field, "metadata") and "setting" in field.metadata
    }


def is_user_key(key: str) -> bool:
    """Whether `key` has the `module:attr` form of user code."""
    return ":" in key


def import_attr(key: str) -> Any:
    """The attribute `attr` of module `module` for key `module:attr` (raises ImportError or
    AttributeError). The working directory is searched too, as `python -m` would."""
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


class Registry(Generic[Entry]):
    """A table of named entries of one kind of part.

    `registry[key]` is the entry for a table name or for `module:attr`; `coerce` turns what a
    user module holds (often a bare function) into an entry, and may raise TypeError naming what
    the entry must be. Resolved user entries are cached, so a key imports its module once.
    """

    def __init__(
        self,
        kind: str,
        config_key: str,
        entries: dict[str, Entry] | None = None,
        *,
        coerce: Callable[[Any], Entry] | None = None,
        split: Callable[[str], list[str]] | None = None,
    ):
        self.kind = kind  # e.g. "optimizer": used in messages
        self.config_key = config_key  # e.g. "optim.name": the setting that picks an entry
        self._entries: dict[str, Entry] = dict(entries or {})
        self._coerce = coerce
        self._user: dict[str, Entry] = {}
        self._raw: dict[str, Any] = {}  # what a user key's module holds, before coercion
        self._split = split  # the keys one config value picks (loss.terms: several)
        REGISTRIES[config_key] = self

    @property
    def group(self) -> str:
        """The settings group the picking key belongs to ("" for a top-level key)."""
        return self.config_key.rpartition(".")[0]

    def keys_in(self, value: Any) -> list[str]:
        """The entry keys a config value picks (one, or loss.terms' several)."""
        if not isinstance(value, str):
            return []
        return self._split(value) if self._split else [value]

    def settings_of(self, key: str) -> dict[str, Any]:
        """{name: field} the entry picked by `key` declares (`declares`); raises RegistryError
        for a key that picks no entry."""
        entry = self[key]
        return {**declared_settings(entry), **declared_settings(self._raw.get(key))}

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
        except RegistryError:
            return False
        return True

    def __getitem__(self, key: str) -> Entry:
        if not isinstance(key, str):
            raise RegistryError(self._unknown(key))
        if key in self._entries:
            return self._entries[key]
        if not is_user_key(key):
            raise RegistryError(self._unknown(key))
        if key not in self._user:
            try:
                value = import_attr(key)
            except (ImportError, AttributeError) as error:
                raise RegistryError(self._unresolved(key, error)) from None
            self._raw[key] = value
            try:
                self._user[key] = self._coerce(value) if self._coerce else value
            except TypeError as error:
                raise RegistryError(f"config.{self.config_key}={key!r}: {error}") from None
        return self._user[key]

    def check(self, key: str) -> None:
        """Raises RegistryError when `key` picks no entry (before a run writes anything)."""
        self[key]

    def _unknown(self, key: object) -> str:
        close = difflib.get_close_matches(str(key), self.names(), n=1)
        return (
            f"config.{self.config_key}={key!r} is not a known {self.kind}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; the {self.kind}s are {', '.join(self.names())}, or name your own code as "
            f"module:attr (a module importable from the working directory or PYTHONPATH)."
        )

    def _unresolved(self, key: str, error: Exception) -> str:
        return (
            f"config.{self.config_key}={key!r} names user code that cannot be loaded "
            f"({type(error).__name__}: {error}): put the module in the working directory or on "
            f"PYTHONPATH (a run trained with it needs it to resume, too), or pick one of the "
            f"{self.kind}s {', '.join(self.names())}."
        )
