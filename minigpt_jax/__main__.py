"""`python -m minigpt_jax train|prepare|sample|lab ...`: the same as the `minigpt-jax` command."""

from minigpt_jax.cli import main

main()
