"""The built-in config `gpt2_small`, re-exported from the package:
minigpt_jax/configs/gpt2_small.py says what it runs;
`--config gpt2_small` names it from any folder."""

from minigpt_jax.configs.gpt2_small import get_config

__all__ = ["get_config"]
