"""Experiment configs: each module's get_config() returns an ml_collections.ConfigDict. The
built-in ones live in the package (minigpt_jax/configs) and are re-exported here, so the
repository's `--config configs/tiny.py` and `from configs import tiny` keep working."""
