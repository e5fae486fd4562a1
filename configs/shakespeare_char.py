"""The built-in config `shakespeare_char`, re-exported from the package:
minigpt_jax/configs/shakespeare_char.py says what it runs;
`--config shakespeare_char` names it from any folder."""

from minigpt_jax.configs.shakespeare_char import get_config

__all__ = ["get_config"]
