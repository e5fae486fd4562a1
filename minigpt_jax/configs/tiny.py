"""A tiny model for tests and CI: compiles and trains in seconds.

Run:      minigpt-jax train --config configs/tiny.py --workdir runs/tiny
Expect:   a few seconds on a 2-core CPU; the loss falls from about log(V).
"""

import ml_collections

from minigpt_jax.config_dict import default_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = default_config()  # configs/default.py's
    config.batch_size = 4
    config.num_steps = 40
    config.steps_per_call = 1  # tests override step counts freely
    config.eval_every = 20
    config.eval_batches = 2
    config.log_every = 5
    config.checkpoint_every = 20
    config.model.block_size = 16
    config.model.n_layer = 2
    config.model.n_head = 2
    config.model.n_embd = 32
    config.model.dropout = 0.0
    config.optim.warmup_steps = 5
    config.optim.lr = 3e-3  # a tiny model tolerates, and needs, a larger step
    config.data.tokenizer = "char"
    return config
