"""Corpora and tokens: the one reader of files (`corpus`), tokenizers, the in-memory format with
batches (`memory`) and token shards for corpora of any size (`shards`)."""
