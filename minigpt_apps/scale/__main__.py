"""`python -m minigpt_apps.scale ARGS` is `minigpt-jax scale ARGS`."""

import sys

from minigpt_apps.scale.command import main

sys.exit(main(sys.argv[1:]))
