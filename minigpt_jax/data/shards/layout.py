"""The layout of a shards directory: its file names, the manifest's format, the token dtype, and
its JSON files read and written atomically.

  tokenizer.json          the tokenizer, with an end-of-text id
  tokens_000000.bin ...   the token stream, shard_tokens tokens per shard (the last fewer), raw
                          little-endian uint16 (uint32 when the vocabulary does not fit)
  manifest.json           written last: inputs and tokenizer fingerprints, counts, split (with
                          the distinct ids of each split), and each shard's sha256
  verified.json           each shard's stat (size, mtime, inode, ctime) when it was last read in
                          full and found to match the manifest, with its largest id
  progress.json           only while preparing: where to resume after an interruption
  prepare.lock            an OS lock held while preparing: a second prepare is refused

The FORMAT strings are on disk: a prepared directory of an earlier version must still be read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from minigpt_jax.data.tokenizers import MAX_UINT16_VOCAB

FORMAT = "minigpt_jax.data.shards/1"
MANIFEST_FILENAME = "manifest.json"
PROGRESS_FILENAME = "progress.json"
VERIFIED_FILENAME = "verified.json"
VERIFIED_FORMAT = "minigpt_jax.data.shards.verified/1"
LOCK_FILENAME = "prepare.lock"  # held by the one process preparing the directory


def shard_name(index: int) -> str:
    return f"tokens_{index:06d}.bin"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2" if vocab_size <= MAX_UINT16_VOCAB else "<u4")


def write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(value, indent=1), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a reader sees the old file or the new one


def read_json(path: Path) -> dict | None:
    """The JSON object in `path`, None if it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
