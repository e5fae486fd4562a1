"""Models on disk: sampling from a run directory's checkpoint and tokenizer, or from a Hugging
Face GPT-2 directory.

The I/O side of `minigpt-jax sample`, kept out of `sampling` (which works on params and ids)
and out of `cli` (which only parses flags).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from minigpt_jax.data.tokenizers import Tokenizer
from minigpt_jax.io.pretrained import load_model, load_run
from minigpt_jax.io.sampling import generate
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import Params


def sample_from_workdir(
    workdir: str | Path, prompt: str, *, checkpoint: str = "latest", **settings
) -> list[str]:
    """Decoded texts: continuations of `prompt` by a trained run.

    Loads the run's checkpoint ('latest' or 'best') and its tokenizer from `workdir`; `settings`
    are those of `sample_texts` (max_new_tokens, temperature, top_k, top_p, seed, num_samples).
    """
    run = load_run(workdir, checkpoint)
    return sample_texts(run.params, run.cfg, run.tokenizer, prompt, **settings)


def sample_from_pretrained(path: str | Path, prompt: str, **settings) -> list[str]:
    """`sample_from_workdir` for a Hugging Face GPT-2 directory (weights and tokenizer)."""
    model = load_model(path)
    return sample_texts(model.params, model.cfg, model.tokenizer, prompt, **settings)


def sample_texts(
    params: Params,
    cfg: GPTConfig,
    tokenizer: Tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 500,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    num_samples: int = 1,
) -> list[str]:
    """Decoded texts: `num_samples` independent continuations of `prompt`, drawn by one
    `generate` call seeded by `seed`."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples}.")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as error:
        char = ord(prompt[error.start])
        # The command line hands undecodable bytes over as lone surrogates U+DC80..U+DCFF.
        what = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"U+{char:04X}"
        raise ValueError(
            f"the prompt is not valid UTF-8 text ({what} at character {error.start}); pass "
            "UTF-8 (check the terminal's encoding, e.g. LANG=C.UTF-8)."
        ) from None
    prompt_ids = tokenizer.encode(prompt)
    if prompt_ids.size == 0:
        raise ValueError("the prompt is empty: give at least one character, e.g. --prompt='\\n'.")
    out_BxT = generate(
        params,
        cfg,
        np.tile(prompt_ids, (num_samples, 1)),
        max_new_tokens,
        rng=jax.random.key(seed),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    return [tokenizer.decode(row) for row in out_BxT]
