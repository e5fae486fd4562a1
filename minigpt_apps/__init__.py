"""The apps built on the minigpt_jax library, outside it: `lab` (the course's embedding lab as
a web page), `sweep` (Optuna studies over config keys) and `compare` (arms over paired seeds).

Each is the command `minigpt-jax NAME`, an entry point of the group `minigpt_jax.commands`
(pyproject.toml); the library never imports them, and they use only its public modules.
"""
