"""The model: positions, attention (masks, scores and kernels), norms and activations (`layers`),
MLPs and blocks (`blocks`), embeddings, the GPT itself and its loss (`gpt`), its config
(`config`) and the loss terms a run may add (`loss_terms`)."""
