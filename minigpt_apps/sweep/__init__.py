"""`minigpt-jax sweep`: Optuna studies over config keys (space, trial, report, study)."""
