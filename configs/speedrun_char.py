"""The built-in config `speedrun_char`, re-exported from the package:
minigpt_jax/configs/speedrun_char.py says what it runs;
`--config speedrun_char` names it from any folder."""

from minigpt_jax.configs.speedrun_char import get_config

__all__ = ["get_config"]
