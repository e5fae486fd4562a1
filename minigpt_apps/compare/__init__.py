"""`minigpt-jax compare`: arms of a config trained over paired seeds, and whether their
difference is real (plan, record, runs, stats, report, command)."""
