"""minigpt-jax: a small GPT in JAX/Flax whose invariants are checked, not assumed.

The public API, each name loaded from its module on first use (so that importing one module,
`minigpt_jax.model.config` say, does not import orbax or the training loop):

    from minigpt_jax import GPTConfig, init_params, forward, generate, load_gpt2, save_gpt2
    from minigpt_jax import build_experiment, train_and_evaluate
"""

import importlib

__version__ = "0.1.0"

# name -> the module that defines it
_PUBLIC = {
    "GPT": "minigpt_jax.model.gpt",
    "checked_forward": "minigpt_jax.model.gpt",
    "count_params": "minigpt_jax.model.gpt",
    "flops_per_token": "minigpt_jax.model.gpt",
    "forward": "minigpt_jax.model.gpt",
    "forward_with_attention": "minigpt_jax.model.gpt",
    "init_params": "minigpt_jax.model.gpt",
    "next_token_losses": "minigpt_jax.model.gpt",
    "vocab_padding_params": "minigpt_jax.model.gpt",
    "GPTConfig": "minigpt_jax.model.config",
    "Embeddings": "minigpt_jax.model.embeddings",
    "check_token_ids": "minigpt_jax.model.embeddings",
    "POSITION_ENCODINGS": "minigpt_jax.model.positions",
    "PositionEncoding": "minigpt_jax.model.positions",
    "sinusoidal_positions": "minigpt_jax.model.positions",
    "generate": "minigpt_jax.sampling.api",
    "generate_stream": "minigpt_jax.sampling.api",
    "SampleSettings": "minigpt_jax.sampling.options",
    "load_gpt2": "minigpt_jax.gpt2",
    "save_gpt2": "minigpt_jax.gpt2",
    "load_model": "minigpt_jax.model_files",
    "train_and_evaluate": "minigpt_jax.train.loop",
    "Experiment": "minigpt_jax.typed_config",
    "build_experiment": "minigpt_jax.typed_config",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
