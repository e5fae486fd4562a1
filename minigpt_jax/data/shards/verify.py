"""Checking prepared shards against their manifest (`verify_shards`: each shard's size, sha256
and ids inside the vocabulary), and the verified-stamp (verified.json) that lets a start on
unchanged shards read none of them: a shard is read only when its stat differs from the one
recorded when it was last read in full and found good (any write changes its ctime, a
replacement its inode)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minigpt_jax.data.shards.layout import (
    MANIFEST_FILENAME,
    VERIFIED_FILENAME,
    VERIFIED_FORMAT,
    read_json,
)
from minigpt_jax.runtime.digests import sha256_file

_log = logging.getLogger(__name__)


def scan_shard(
    path: Path, dtype: np.dtype, on_block: Callable[[np.ndarray, int], None] | None = None
) -> dict:
    """{"stat", "sha256", "largest_id"} of a shard file, in one read of 16 MiB blocks (the stat
    taken first, so a write during the read shows at the next check); on_block(ids, at) sees
    each block's ids and the index of its first one in the shard."""
    stat = _stat(path)
    digest, largest, at = hashlib.sha256(), -1, 0
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 24), b""):
            digest.update(block)
            ids = np.frombuffer(block, dtype)
            if ids.size:
                largest = max(largest, int(ids.max()))
                if on_block is not None:
                    on_block(ids, at)
            at += ids.size
    return {"stat": stat, "sha256": digest.hexdigest(), "largest_id": largest}


def _stat(path: Path) -> list[int]:
    """What any write (ctime, mtime, size) or replacement (inode) of a file changes."""
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns]


@dataclass(frozen=True)
class ShardCheck:
    """What verify_shards found: the problem (None: every shard matches its manifest), the
    shards it read in full, and what verified.json records of each shard checked (its stat,
    sha256 and largest id; a shard's sha256 is known even where an older manifest lacks it)."""

    problem: str | None
    read: list[str]
    entries: dict[str, dict]
    manifest_sha256: str

    @property
    def sha256s(self) -> list[str]:
        return [entry["sha256"] for entry in self.entries.values()]


def verify_shards(directory: str | os.PathLike, manifest: dict) -> ShardCheck:
    """Checks the shards a manifest lists: each is there with its size, its sha256 (manifests
    of older versions have none: not checked) and ids inside the tokenizer's vocabulary. A
    shard is read for the last two only if its stat differs from the one verified.json
    recorded when it was last read and found good. Reads only."""
    directory = Path(directory)
    dtype = np.dtype(manifest["dtype"])
    vocab_size = manifest["tokenizer"]["vocab_size"]
    manifest_sha256 = sha256_file(directory / MANIFEST_FILENAME)
    saved = read_json(directory / VERIFIED_FILENAME) or {}
    fresh = saved.get("format") == VERIFIED_FORMAT
    vouched = saved.get("shards", {}) if fresh and saved.get("manifest") == manifest_sha256 else {}
    entries, read = {}, []
    for shard in manifest["shards"]:
        path = directory / shard["file"]
        if not path.is_file():
            return ShardCheck(f"shard {path} is missing", read, entries, manifest_sha256)
        size = path.stat().st_size
        if size != shard["tokens"] * dtype.itemsize:
            problem = (
                f"shard {path} holds {size} bytes, not the {shard['tokens'] * dtype.itemsize} "
                f"of its {shard['tokens']} tokens"
            )
            return ShardCheck(problem, read, entries, manifest_sha256)
        entry = vouched.get(shard["file"])
        if entry is None or entry.get("stat") != _stat(path):
            entry = scan_shard(path, dtype)
            read.append(shard["file"])
        if shard.get("sha256", entry["sha256"]) != entry["sha256"]:
            problem = (
                f"shard {path} does not match its sha256 in {MANIFEST_FILENAME} (damaged or edited)"
            )
            return ShardCheck(problem, read, entries, manifest_sha256)
        if entry["largest_id"] >= vocab_size:
            problem = (
                f"shard {path} holds id {entry['largest_id']}, outside the tokenizer's "
                f"[0, {vocab_size})"
            )
            return ShardCheck(problem, read, entries, manifest_sha256)
        entries[shard["file"]] = entry
    return ShardCheck(None, read, entries, manifest_sha256)


def write_stamp(directory: Path, check: ShardCheck, *, always: bool = False) -> None:
    """Writes verified.json from a good check when it read a shard (or `always`). Any process
    of a run may: a unique temporary name, then an atomic rename; a folder this process cannot
    write keeps the old stamp (the next start reads the shards again)."""
    if not (check.read or always):
        return
    stamp = {"format": VERIFIED_FORMAT, "manifest": check.manifest_sha256, "shards": check.entries}
    tmp = None
    try:
        with tempfile.NamedTemporaryFile(
            "w", dir=directory, prefix=f".{VERIFIED_FILENAME}.", suffix=".part", delete=False
        ) as tmp:
            json.dump(stamp, tmp, indent=1)
        os.replace(tmp.name, directory / VERIFIED_FILENAME)
    except OSError as error:
        _log.info("could not record the verified shards in %s (%s).", directory, error)
        if tmp is not None:
            Path(tmp.name).unlink(missing_ok=True)
