"""Experiments: one runnable study per module (`python -m experiments.NAME --outdir DIR`)."""
