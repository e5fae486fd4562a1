"""The built-in config `tiny`, re-exported from the package:
minigpt_jax/configs/tiny.py says what it runs;
`--config tiny` names it from any folder."""

from minigpt_jax.configs.tiny import get_config

__all__ = ["get_config"]
