"""Moved: a sweep is `minigpt-jax sweep`, an Optuna study (minigpt_apps/sweep/: samplers,
pruning from the val curve, a study many workers share, plots). This module only runs it:

    python -m experiments.sweep ARGS     is     minigpt-jax sweep ARGS
"""

import sys

from minigpt_apps.sweep.command import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
