"""The course's mini-GPT on the embedded corpus: CPython's own documentation (pydoc_data).

Run:      minigpt-jax train --config configs/default.py --workdir runs/default
Needs:    nothing downloaded; byte-level BPE with 512 tokens, as the course's V=512.
Expect:   val loss 3.09 nats/token at step 1500 (measured: train 2.5705, val 3.0913); 1,500
          steps of batch 16 x 64 tokens, about 1.3x the work of a shakespeare_char step each
          (the 512-token head). On a 2-core Intel Xeon (AVX-512), shared with other jobs
          (load average 4-13): 215-255 s wall, median 101-141 ms/step, against 294-376 s and
          145-202 ms/step with the previous defaults (1 step per call, autodiff Dense
          gradients), in two back-to-back pairs; the same val loss.
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    config = ml_collections.ConfigDict()
    config.seed = 0  # one key, split into init, data and dropout keys
    config.batch_size = 16  # sequences per optimizer step (all micro-batches, all devices)
    config.grad_accum_steps = 1  # micro-batches of batch_size / grad_accum_steps per step
    config.num_steps = 1500  # optimizer steps in the whole run
    # Optimizer steps per compiled call (a lax.scan over batches; metrics stay per step): one
    # dispatch and host round trip per 10 steps instead of per step.
    config.steps_per_call = 10
    config.eval_every = 250  # steps between validation passes (multiple of steps_per_call)
    config.eval_batches = 20  # validation batches (of one micro-batch each) per pass, fixed
    config.log_every = 10  # steps between progress-bar and TensorBoard updates
    config.checkpoint_every = 250  # steps between checkpoints (multiple of steps_per_call)
    config.keep_checkpoints = 3  # latest checkpoints kept; the best by val loss is kept apart
    # Fine-tune from a model instead of a random init: a Hugging Face GPT-2 directory or a run's
    # workdir ("" = from scratch). Its tokenizer replaces config.data's; config.model must match it.
    config.init_from = ""

    config.model = ml_collections.ConfigDict()
    config.model.block_size = 64  # context length T_max
    config.model.n_layer = 4
    config.model.n_head = 4
    config.model.n_embd = 128  # width D
    config.model.dropout = 0.1
    config.model.pos_encoding = "learned"  # learned | sinusoidal | rope | none
    config.model.tie_embeddings = True  # logits through the token table (embed.attend)
    config.model.embed_scale = 1.0  # token embeddings x this; sqrt(n_embd) in Vaswani et al.
    config.model.causal = True
    config.model.use_bias = True
    config.model.mlp_ratio = 4
    config.model.gelu_approximate = False  # True: GPT-2's tanh GELU; False: exact erf GELU
    config.model.dense_grad = "auto"  # Dense VJP: auto (direct on CPU) | autodiff | direct
    config.model.attention = "auto"  # auto (cuDNN on NVIDIA GPUs) | explicit | xla | cudnn
    config.model.vocab_multiple = 1  # pad the token table to a multiple of this (64 on GPUs)
    config.model.loss_chunk = 0  # tokens per chunk of the loss's read-out; 0: all at once
    config.model.remat = "none"  # recompute activations in the backward pass: none | dots | full
    config.model.dtype = "float32"  # compute dtype; bfloat16 on accelerators
    config.model.param_dtype = "float32"

    config.optim = ml_collections.ConfigDict()
    config.optim.lr = 1e-3  # peak learning rate after warmup
    config.optim.min_lr = 1e-4  # end of the cosine decay, reached at num_steps
    config.optim.warmup_steps = 100  # linear warmup from 0
    config.optim.b1 = 0.9  # AdamW betas
    config.optim.b2 = 0.99
    config.optim.eps = 1e-8
    config.optim.weight_decay = 0.1  # on kernels and embedding tables, not biases or norms
    config.optim.grad_clip = 1.0  # global-norm clipping threshold

    config.data = ml_collections.ConfigDict()
    config.data.corpus = "pydoc"  # pydoc (embedded) | shakespeare | text (a .txt file or dir)
    config.data.path = config_dict.placeholder(str)  # file, directory or glob (shards)
    config.data.tokenizer = "bpe"  # char | bpe (byte-level)
    config.data.vocab_size = 512  # BPE vocabulary (256 bytes + merges); char ignores it
    config.data.val_fraction = 0.1  # the last 10% of the tokens is the validation split
    # memory: the corpus is read, encoded and held in RAM (workdir/tokens.npy), for small texts;
    # shards: streamed into memory-mapped token shards with an end-of-text id after every
    # document (.txt files and .jsonl lines), any size (minigpt_jax/shards.py).
    config.data.format = "memory"
    config.data.shards_dir = config_dict.placeholder(str)  # shards: default workdir/shards
    config.data.text_field = "text"  # shards: the field of a .jsonl line that holds its text
    config.data.shard_tokens = 1 << 27  # shards: tokens per shard file (256 MB of uint16)
    config.data.tokenizer_sample_bytes = 1 << 26  # shards: text a BPE tokenizer is trained on

    # Device mesh (minigpt_jax/sharding.py): the batch splits over data × fsdp, params over
    # fsdp, heads / MLP units / vocabulary over tensor. -1: all remaining devices.
    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = -1
    config.mesh.fsdp = 1
    config.mesh.tensor = 1
    return config
