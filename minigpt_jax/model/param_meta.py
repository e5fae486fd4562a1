"""Each parameter's metadata, declared where the parameter is created, beside its init.

`declare(init, axes, muon=..., decay=..., gpt2=...)` wraps an initializer (as
`nn.with_partitioning` does, and in its place) so that the created parameter is boxed in a
`Declared`: the mesh axes its dimensions are split over (`sharding.tree_specs` reads them, as
for `nn.Partitioned`), and a `ParamMeta`:
  muon    (reduction_axis, output_axis): Muon orthogonalises it, reading it as matrices so
          (optax.contrib.MuonDimensionNumbers); None: AdamW's (`optimizer_entries.muon`)
  decay   whether decoupled weight decay applies (`decay_mask`)
  gpt2    its GPT-2 tensor name ("h.{i}.mlp.c_fc.weight", {i} the layer), where the GPT-2 layout
          has it (`gpt2.py`); gpt2_transpose: stored transposed there (an untied head)
  tags    names of groups it belongs to, open to any plug-in: the built-in ones are "embedding"
          (the token and position tables), "attention", "mlp" and "head" (an untied head);
          `optim.lr_multipliers` and optimizer entries select parameters by tag
          (`optimizer_wrappers.scale_by_tags`, `param_meta.tags_of`), never by name

A vector (a bias, a norm's scale: ndim <= 1) may go undeclared: AdamW, no decay, no GPT-2 name
beyond what `gpt2.py` names itself. A matrix that nothing declares is an error naming its
path (`metadata`), never a silent AdamW.

`init_annotated_params` records every parameter's metadata by path (`record`), and the
optimizers look parameters up by path (`lookup`), so a mask or Muon's dimension numbers need
only the params pytree that optax hands them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
from flax import struct

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ParamMeta:
    """A parameter's optimizer group, weight decay and GPT-2 name (see the module docstring)."""

    muon: tuple[Any, Any] | None = None
    decay: bool = False
    gpt2: str | None = None
    gpt2_transpose: bool = False
    tags: tuple[str, ...] = ()


VECTOR = ParamMeta()  # what an undeclared vector gets: AdamW, no decay


class Declared(nn.Partitioned):
    """An `nn.Partitioned` box that also carries its parameter's `ParamMeta`."""

    meta: ParamMeta = struct.field(pytree_node=False, default=VECTOR)


def declare(
    init: Callable[..., Any],
    axes: tuple[str | None, ...] | None = None,
    *,
    muon: tuple[Any, Any] | None = None,
    decay: bool = False,
    gpt2: str | None = None,
    gpt2_transpose: bool = False,
    tags: tuple[str, ...] | list[str] = (),
) -> Callable[..., Declared]:
    """`init` whose output is boxed with mesh axes `axes` (one per dimension, None: not split;
    None for all: no split at all) and the metadata (see the module docstring)."""
    if isinstance(tags, str):
        raise TypeError(f"declare(tags=...) takes a tuple of names, got the string {tags!r}.")
    meta = ParamMeta(muon, decay, gpt2, gpt2_transpose, tuple(tags))

    def declared_init(*args, **kwargs) -> Declared:
        value = init(*args, **kwargs)
        names = (None,) * len(value.shape) if axes is None else tuple(axes)
        return Declared(value, names, meta=meta)

    return declared_init


class UndeclaredParameterError(ValueError):
    """A parameter of two or more dimensions whose creation site declares no metadata."""


def path_names(path) -> Path:
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def metadata(annotated_params: Any, prefix: Path = ()) -> dict[Path, ParamMeta]:
    """{parameter path: ParamMeta} of a boxed params tree (`init_annotated_params`'s, or its
    `jax.eval_shape`; `prefix`: where a part's own tree sits in the model's). Raises
    UndeclaredParameterError for a matrix that declares none."""
    leaves = jax.tree_util.tree_flatten_with_path(
        annotated_params, is_leaf=lambda x: isinstance(x, nn.Partitioned)
    )[0]
    found = {}
    for path, leaf in leaves:
        names = prefix + path_names(path)
        if isinstance(leaf, Declared):
            found[names] = leaf.meta
            continue
        value = leaf.value if isinstance(leaf, nn.Partitioned) else leaf
        if len(value.shape) > 1:
            raise UndeclaredParameterError(
                f"parameter {'/'.join(names)} (shape {tuple(value.shape)}) declares no optimizer "
                f"group or weight decay: create it with "
                f"minigpt_jax.model.param_meta.declare(init, axes, muon=..., decay=...) in place "
                f"of its init (muon=None for AdamW; docs/extending/model.md, 'A gated MLP')."
            )
        found[names] = VECTOR
    return found


_RECORDED: dict[Path, ParamMeta] = {}


def record(annotated_params: Any) -> dict[Path, ParamMeta]:
    """`metadata(annotated_params)`, kept for `lookup` (the newest model's wins per path)."""
    found = metadata(annotated_params)
    _RECORDED.update(found)
    return found


def lookup(path, leaf: Any) -> ParamMeta:
    """The recorded metadata of the parameter at `path` (a key path; its longest recorded
    suffix, so an optimizer state's `mu/...` paths find their parameter). A vector nothing
    recorded is `VECTOR`; a matrix is an UndeclaredParameterError."""
    names = path_names(path)
    for start in range(len(names)):
        meta = _RECORDED.get(names[start:])
        if meta is not None:
            return meta
    if len(getattr(leaf, "shape", ())) <= 1:
        return VECTOR
    raise UndeclaredParameterError(
        f"parameter {'/'.join(names)} has no recorded metadata (optimizer group, weight "
        f"decay): build the params with minigpt_jax.init_params (or init_annotated_params), "
        f"whose modules declare it with param_meta.declare."
    )


def decay_mask(params: Any) -> Any:
    """Each parameter's declared weight decay (`declare(decay=)`, read by `lookup`): True for the
    weight matrices and embedding tables, False for the biases and norm scales."""
    return jax.tree_util.tree_map_with_path(lambda path, leaf: lookup(path, leaf).decay, params)


def tags_of(path, leaf: Any) -> tuple[str, ...]:
    """The tags the parameter at `path` declares (`lookup`'s metadata); () for none."""
    return lookup(path, leaf).tags


@contextlib.contextmanager
def using(metas: dict[Path, ParamMeta]) -> Iterator[None]:
    """`lookup` reads `metas` instead of the recorded table while inside (a probe's params)."""
    saved = dict(_RECORDED)
    _RECORDED.clear()
    _RECORDED.update(metas)
    try:
        yield
    finally:
        _RECORDED.clear()
        _RECORDED.update(saved)
