"""GPT-2 small (124M parameters) for accelerators: bfloat16 compute, float32 params and logits.

Run:      minigpt-jax train --config configs/gpt2_small.py --workdir runs/gpt2_small \
            --config.data.path='/path/to/corpus/*.jsonl'
          (the first run streams the corpus into token shards in runs/gpt2_small/shards, as
          `minigpt-jax prepare` with the same flags does ahead of time; later runs reuse them)
Needs:    a GPU or TPU; on a 2-core CPU one step takes minutes.
Expect:   124,439,808 parameters with a 50,257-token vocabulary (GPT-2's size: 50,000 merges
          learned from a 64 MB sample of the corpus, 256 bytes and <|endoftext|> last), plus
          36,096 in the 47 padding rows of the token table (vocab_multiple=64).
Batch:    GPT-2's ~0.5M tokens per optimizer step: 512 sequences of 1,024 tokens, accumulated
          over 32 micro-batches of 16 (nanoGPT: 12 x 1,024 x 40). Each micro-batch splits over
          mesh data x fsdp; on 8 devices, --config.grad_accum_steps=4 gives each 16 rows.
Speed:    on an NVIDIA GPU the "auto" defaults pick cuDNN flash attention and autodiff Dense
          gradients; `python -m benchmarks.gpu_mfu` times this model beside its torch.compile
          twin (benchmarks/README.md).
"""

import ml_collections

from minigpt_jax.config_dict import default_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = default_config()  # configs/default.py's
    config.batch_size = 512  # sequences per optimizer step: 512 x 1024 = 524,288 tokens
    config.grad_accum_steps = 32  # micro-batches of 16 sequences
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
    config.model.vocab_multiple = 64  # 50,257 -> 50,304 table rows: the head's matmul tiles evenly
    config.model.dtype = "bfloat16"
    config.model.param_dtype = "float32"
    config.optim.lr = 6e-4
    config.optim.min_lr = 6e-5
    config.optim.warmup_steps = 700
    config.optim.b1, config.optim.b2 = 0.9, 0.95
    config.data.corpus = "text"
    config.data.format = "shards"  # any corpus size: memory-mapped token shards
    config.data.tokenizer = "bpe"
    config.data.vocab_size = 50257
    return config
