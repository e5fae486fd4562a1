"""Corpora and tokens: the one reader of files and the file-format registry (`corpus`),
tokenizers and their registry (`tokenizers`), corpora by name (`sources`), what every data
format gives a run (`dataset`: the Dataset, its split and batches), the in-memory format
(`in_memory`), token shards for corpora of any size (`shards/`), and the Dataset a run config
names (`formats`: the registry of data.format)."""
