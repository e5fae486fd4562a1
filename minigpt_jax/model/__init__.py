"""The model: positions, attention (masks, scores and kernels), norms and activations (`layers`),
MLPs and blocks (`blocks`), embeddings, the GPT itself (`gpt`), its config (`config`), the
loss terms of its read-out (`losses`) and the metrics an evaluation reads from it
(`eval_metrics`)."""
