"""The built-in config `default`, re-exported from the package:
minigpt_jax/configs/default.py says what it runs;
`--config default` names it from any folder."""

from minigpt_jax.configs.default import get_config

__all__ = ["get_config"]
