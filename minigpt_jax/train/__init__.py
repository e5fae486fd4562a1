"""Training: optimizers and schedules (`optimizers`), the compiled train step (`step`), evaluation
(`evaluation`), the loop (`loop`: `Trainer`, `train_and_evaluate`), checkpoints, resume rules and
what a run logs (`metrics`)."""
