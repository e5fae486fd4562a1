"""What a run needs around its work, whatever the work: its checkpoints (`checkpoint`: orbax,
digests, the newest intact step), SIGINT/SIGTERM and how each command stops (`signals`), OS file
locks and the run lock (`locks`), every path of a run directory (`run_dir`), file digests
(`digests`), JAX's persistent compilation cache (`compile_cache`) and wall-clock timing
(`timing`). They import nothing of the package outside this room."""
