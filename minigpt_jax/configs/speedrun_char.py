"""The speedrun on the course's CPU track: reach the PyTorch twin's val loss as fast as possible.

Rules (as in the NanoGPT speedrun): the same data and split as configs/shakespeare_char.py
(Tiny Shakespeare, the char tokenizer, the first 90% of the tokens for training, the last 10%
for validation), context 64, CPU only, one process; any architecture and optimizer. The clock
runs from process start (imports, data and compilation count) and stops during evaluation,
which scores every position of the whole validation split (benchmarks/time_to_loss.py).
Run:      python -m benchmarks.time_to_loss      (beside the twin and the course config)
          minigpt-jax train --config configs/speedrun_char.py --workdir runs/speedrun
Swept:    with `minigpt-jax sweep` (experiments/README.md §11; TPE, median pruner, 2 workers,
          target 1.88 on 60 fixed val batches, the 2-core AMD EPYC): 24 trials over muon_lr
          0.005-0.1, lr 0.002-0.04, batch 12/24, 400 steps at most; 6 complete (all reach
          1.88), 18 pruned (15 at step 50), 465 s of wall time. Fastest to 1.88: batch 24,
          muon_lr 0.014, lr 0.014, at step 250; batch 12 (muon_lr 0.026, lr 0.017) at step
          350. The pruner compares equal steps, so it pruned batch 12 (half the tokens a step)
          early. Before it, a hand-written grid of 19 full trials: muon_lr 0.02/0.04/0.08 x
          lr 0.004/0.008/0.016 at 400 steps (best 0.02 and 0.016: 1.816; 0.08 misses 1.88);
          batch 12/24 x 200/300 steps x muon_lr 0.01/0.02 at lr 0.016 (12 x 300, 0.01: 1.854;
          12 x 200: 1.900, misses; 24 x 200: 1.808 with twice the tokens per step). Kept: 12 x
          64, muon_lr 0.01, lr 0.016 (the fewest tokens that reach the target); on the whole
          validation split 300 steps end at 1.8606, 250 at 1.8717 and 220 at 1.8861, below the
          twin's 1.8943: 220 steps (168,960 tokens). With the training step's bf16 matmuls and
          Muon's bf16 Newton-Schulz operands (optim.muon_ns_dtype auto, on the AMD EPYC with
          AVX512-BF16): 1.8861 at 220 (float32 Newton-Schulz: 1.8856; benchmarks/README.md).
Ablation: experiments/speedrun_ablation.py removes each trick in turn (experiments/README.md).
"""

import ml_collections

from minigpt_jax.configs import shakespeare_char


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = shakespeare_char.get_config(arg)
    config.num_steps = 220
    config.batch_size = 12  # as the recipe: 12 x 64 tokens per step
    config.steps_per_call = 10
    config.eval_every = 100
    config.checkpoint_every = 100
    config.model.pos_encoding = "rope"
    config.model.norm = "rmsnorm"
    config.model.activation = "relu2"
    config.model.qk_norm = True
    config.model.zero_init_proj = True
    config.model.logit_softcap = 15.0
    config.model.use_bias = False
    config.model.tie_embeddings = False
    config.optim.name = "muon"
    config.optim.schedule = "wsd"
    config.optim.lr = 0.016  # AdamW's: embeddings, head, norm scales
    config.optim.muon_lr = 0.01  # the blocks' matrices
    config.optim.min_lr = 0.0
    config.optim.warmup_steps = 0
    config.optim.decay_fraction = 0.4
    config.optim.b1, config.optim.b2 = 0.8, 0.95
    config.optim.weight_decay = 0.0
    return config
