"""GPT-2 small (124M parameters) for accelerators: bfloat16 compute, float32 params and logits.

Run:      minigpt-jax train --config configs/gpt2_small.py --workdir runs/gpt2_small \
            --config.data.corpus=text --config.data.path=/path/to/corpus
Needs:    a GPU or TPU; on a 2-core CPU one step takes tens of seconds.
Expect:   124,439,808 parameters with a 50,257-token vocabulary (GPT-2's size; the BPE is
          trained on the given corpus, so a small corpus yields fewer merges and errors).
"""

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = default.get_config(arg)
    config.batch_size = 32
    config.num_steps = 20_000
    config.steps_per_call = 10
    config.eval_every = 1000
    config.eval_batches = 50
    config.log_every = 50
    config.checkpoint_every = 1000
    config.model.block_size = 1024
    config.model.n_layer = 12
    config.model.n_head = 12
    config.model.n_embd = 768
    config.model.dropout = 0.0
    config.model.gelu_approximate = True  # GPT-2's own GELU
    config.model.dtype = "bfloat16"
    config.model.param_dtype = "float32"
    config.optim.lr = 6e-4
    config.optim.min_lr = 6e-5
    config.optim.warmup_steps = 700
    config.optim.b1, config.optim.b2 = 0.9, 0.95
    config.data.corpus = "text"
    config.data.tokenizer = "bpe"
    config.data.vocab_size = 50257
    return config
