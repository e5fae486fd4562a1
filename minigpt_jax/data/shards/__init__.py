"""Corpora of any size as memory-mapped token shards: the directory's layout (`layout`), preparing
them (`prepare`, with the encoding pass in `encoding`), checking them (`verify`), the stream's
digest (`digest`) and reading them for a run (`read`: `sharded_dataset`, `load_shards`)."""
