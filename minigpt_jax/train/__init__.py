"""Training: the compiled train step (`step`) and eval steps (`eval_step`), evaluation
(`evaluation`) and the metrics it can add (`eval_metrics`), the loop (`loop`: `Trainer`,
`train_and_evaluate`), what it does when a step goes wrong (`recovery`) and says when it ends
(`summary`), resume rules and what a run logs (`metrics`)."""
