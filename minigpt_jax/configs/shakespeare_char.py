"""Character-level Tiny Shakespeare: the well-known CPU recipe (nanoGPT's shakespeare_char, CPU).

Run:      MINIGPT_JAX_DATA=/dir/with/tinyshakespeare.txt \
            minigpt-jax train --config configs/shakespeare_char.py --workdir runs/sc
Needs:    tinyshakespeare.txt (1,115,394 bytes) in $MINIGPT_JAX_DATA or at --config.data.path;
          downloaded (sha256-checked) when online and absent.
Expect:   val loss <= 1.90 at step 2000 (the PyTorch recipe reaches about 1.88); measured:
          train 1.7409, val 1.8742, in 122 s on a 2-core AMD EPYC (median 50 ms/step,
          float32); with this CPU's defaults (bf16 matmuls, the LayerNorm's hand-written VJP:
          docs/speed.md) train 1.7416, val 1.8754 in 71.9 s (median 28.8 ms/step), and 1.8741
          with model.norm_grad=autodiff: the VJP's float rounding, not a different model.
Variant:  `configs/shakespeare_char.py:nanogpt` is nanoGPT's own recipe exactly (exact GELU, no
          biases), the PyTorch twin's in benchmarks/time_to_loss.py.

The model, optimizer and schedule are the defaults (configs/default.py: 4 x 4 heads x 128,
context 64, AdamW 1e-3 -> 1e-4 on a 100-step warmup + cosine); this file states what differs.
"""

import ml_collections

from minigpt_jax.config_dict import default_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = default_config()  # configs/default.py's
    config.batch_size = 12
    config.num_steps = 2000
    config.model.dropout = 0.0
    config.model.gelu_approximate = True  # GPT-2's tanh GELU: its gradient is cheaper on CPU
    config.data.corpus = "shakespeare"
    config.data.tokenizer = "char"
    if arg == "nanogpt":  # nanoGPT's train.py defaults: exact GELU, bias=False
        config.model.gelu_approximate = False
        config.model.use_bias = False
    elif arg:
        raise ValueError(
            f"configs/shakespeare_char.py takes no argument or 'nanogpt', not {arg!r}."
        )
    return config
