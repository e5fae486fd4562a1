"""`minigpt-jax scale`: an IsoFLOP grid of runs, scaling laws fitted with bootstrap intervals,
a larger run predicted and checked (plan, fit, runs, report, command)."""
