"""Corpora of any size as memory-mapped token shards: the directory's layout (`layout`), preparing
them (`prepare`, with the encoding pass in `encoding`), checking them (`verify`), the stream's
digest (`digest`) and reading them for a run (`read`: `sharded_dataset`, `load_shards`).

The names of the module this package replaces (`from minigpt_jax.data.shards import
sharded_dataset`) are still found, with a DeprecationWarning naming their module now."""

from minigpt_jax import _moved

__getattr__ = _moved.old_names(__name__)
