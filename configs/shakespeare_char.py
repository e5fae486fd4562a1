"""Character-level Tiny Shakespeare: the well-known CPU recipe (nanoGPT's shakespeare_char, CPU).

Run:      MINIGPT_JAX_DATA=/dir/with/tinyshakespeare.txt \
            minigpt-jax train --config configs/shakespeare_char.py --workdir runs/sc
Needs:    tinyshakespeare.txt (1,115,394 bytes) in $MINIGPT_JAX_DATA or at --config.data.path;
          downloaded (sha256-checked) when online and absent.
Expect:   val loss <= 1.90 at step 2000 (the PyTorch recipe reaches about 1.88); measured:
          train 1.7409, val 1.8742, in 122 s on a 2-core AMD EPYC (median 50 ms/step).
"""

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = default.get_config(arg)
    config.batch_size = 12
    config.num_steps = 2000
    # CPU speed (benchmarks/train_throughput.py): 10 steps per compiled call; eval and
    # checkpoint steps stay multiples of it.
    config.steps_per_call = 10
    config.eval_every = 250
    config.eval_batches = 20
    config.checkpoint_every = 250
    config.model.block_size = 64
    config.model.n_layer = 4
    config.model.n_head = 4
    config.model.n_embd = 128
    config.model.dropout = 0.0
    config.model.gelu_approximate = True  # GPT-2's tanh GELU: its gradient is cheaper on CPU
    config.model.dense_grad = "auto"  # the hand-written Dense VJP on CPU: XLA:CPU runs it faster
    config.optim.lr = 1e-3
    config.optim.min_lr = 1e-4
    config.optim.warmup_steps = 100
    config.optim.b1, config.optim.b2 = 0.9, 0.99
    config.optim.weight_decay = 0.1
    config.optim.grad_clip = 1.0
    config.data.corpus = "shakespeare"
    config.data.tokenizer = "char"
    return config
