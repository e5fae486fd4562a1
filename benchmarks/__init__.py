"""Throughput benchmarks and side-by-side comparisons of minigpt-jax (not part of the package)."""
