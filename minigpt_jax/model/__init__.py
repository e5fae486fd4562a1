"""The model: positions, attention (masks, scores and kernels), norms and activations (`layers`),
MLPs and blocks (`blocks`), embeddings, the GPT itself (`gpt`), its config (`config`), its loss
(`losses`), the loss terms a run may add (`loss_terms`) and the metrics an evaluation reads
from it (`eval_metrics`)."""
