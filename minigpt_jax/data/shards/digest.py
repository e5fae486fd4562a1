"""The digest of a sharded token stream, as a run's checkpoints record it: the sha256 of its
shards' (tokens, sha256) in order, so it is known without reading the shards."""

from __future__ import annotations

import hashlib

from minigpt_jax.data.dataset import DataDigest
from minigpt_jax.data.shards.verify import ShardCheck


def stream_sha256(dtype: str, shards: list[tuple[int, str]]) -> str:
    """The sha256 of a token stream from its shards' (tokens, sha256), in order: the shards'
    bytes name the stream, so it is known without reading them."""
    digest = hashlib.sha256(f"{dtype}\n".encode())
    for tokens, sha256 in shards:
        digest.update(f"{tokens} {sha256}\n".encode())
    return digest.hexdigest()


def stream_digest(dtype: str, shards: list[tuple[int, str]]) -> DataDigest:
    """The DataDigest of the stream of `shards` ((tokens, sha256) of each, in order)."""
    return DataDigest("shards", sum(tokens for tokens, _ in shards), stream_sha256(dtype, shards))


def manifest_digest(manifest: dict, check: ShardCheck | None) -> DataDigest:
    """The DataDigest of a manifest's shards (a manifest of an older version, without their
    sha256s, takes those its ShardCheck read)."""
    sha256s = [shard.get("sha256") for shard in manifest["shards"]]
    if None in sha256s:
        sha256s = check.sha256s
    tokens = [shard["tokens"] for shard in manifest["shards"]]
    return stream_digest(manifest["dtype"], list(zip(tokens, sha256s, strict=True)))
