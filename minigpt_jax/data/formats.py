"""The Dataset a run config names: data.format picks how a run holds its tokens, an entry of
`DATA_FORMATS` ("memory": in RAM, in_memory.prepare_dataset; "shards": memory-mapped shards,
shards.read.sharded_dataset; or module:attr), and `dataset_from` calls it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import jax
from jax.experimental import multihost_utils

from minigpt_jax.data.dataset import DataDigest, Dataset
from minigpt_jax.data.in_memory import prepare_dataset
from minigpt_jax.data.shards.read import sharded_dataset
from minigpt_jax.data.tokenizers import Tokenizer
from minigpt_jax.settings.registry import Registry

if TYPE_CHECKING:  # typed_config imports this module (its registry): a type-only import
    from minigpt_jax.typed_config import Experiment


def dataset_from(
    config: Experiment,
    workdir: str | Path | None,
    tokenizer: Tokenizer | None = None,
    *,
    progress: bool = False,
    before_writing: Callable[[], None] | None = None,
    check_data: Callable[[DataDigest], None] | None = None,
    documents: bool = False,
) -> Dataset:
    """The run's tokenizer and token splits as its data group describes them, cached in
    `workdir` (a resumed or re-read run finds its own tokenizer and tokens there), by the entry
    of DATA_FORMATS that data.format picks: held in RAM ("memory"), or memory-mapped from
    shards prepared on first use ("shards"). A given `tokenizer` (a pretrained model's)
    replaces data.tokenizer and data.vocab_size. check_data(digest) sees the digest of the
    token stream the run will train on once it is known, and before_writing() is called once
    the data checks have passed; both come before the first write, so a check_data that raises
    leaves every data file as it was. documents: the model packs documents, so every document
    must end with the end-of-text id (an entry is called with documents=True only then)."""
    extra = {"documents": True} if documents else {}
    return DATA_FORMATS[config.data.format](
        config,
        workdir,
        tokenizer,
        progress=progress,
        before_writing=before_writing,
        check_data=check_data,
        **extra,
    )


def _memory_dataset(
    config: Experiment, workdir, tokenizer, *, progress, before_writing, check_data, documents=False
):
    del progress  # one call; nothing to show
    return prepare_dataset(
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
        documents=documents,
        before_writing=before_writing,
        check_data=check_data,
    )


def _sharded_dataset(
    config: Experiment, workdir, tokenizer, *, progress, before_writing, check_data, documents=False
):
    del documents  # shards always close each document with the end-of-text id
    if workdir is None:
        raise ValueError("data.format 'shards' needs a workdir to keep its tokenizer in.")
    prepare = functools.partial(
        sharded_dataset,
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


# The registry of data.format (a setting of minigpt_jax.settings.groups.Data).
DATA_FORMATS = Registry(
    "data format",
    "data.format",
    {"memory": _memory_dataset, "shards": _sharded_dataset},
    arity=3,
    shape="a function (config, workdir, tokenizer, *, progress, before_writing, check_data) -> "
    "minigpt_jax.data.dataset.Dataset",
)
