"""GPT-2 checkpoints in the Hugging Face layout: read into the params pytree, and runs written out.

A Hugging Face GPT-2 directory (what `GPT2LMHeadModel.save_pretrained` writes, and what the hub
holds for gpt2, gpt2-medium, -large and -xl) is `config.json` + `model.safetensors` (or shards
listed in `model.safetensors.index.json`), with the tokenizer as `tokenizer.json` or
`vocab.json` + `merges.txt`. The tensors are read with numpy: no torch at run time.

GPT-2's tensors and this package's params (N layers, D width, H heads, K head dim):
  wte.weight (V, D)                 embed/tok/embedding; also the tied head (no lm_head tensor)
  wpe.weight (T_max, D)             embed/pos/embedding
  h.{i}.ln_1.{weight,bias}          block_{i}/ln_1/{scale,bias}   (ln_2, ln_f alike)
  h.{i}.attn.c_attn.weight (D, 3D)  block_{i}/attn/qkv/kernel (D, 3, H, K): Conv1D is in x out,
                                    its 3D outputs are q, k, v, each head-major
  h.{i}.attn.c_proj.weight (D, D)   block_{i}/attn/proj/kernel (H, K, D)
  h.{i}.mlp.c_fc.weight (D, F)      block_{i}/mlp/fc/kernel (D, F); c_proj likewise (F, D)
  lm_head.weight (V, D)             lm_head/kernel (D, V), only when the config unties it
Each parameter declares its GPT-2 name where the model creates it (`param_meta.declare(gpt2=)`);
`gpt2_names` reads them, so import and export follow the model's own declarations.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax.data.tokenizers import (
    BPETokenizer,
    Tokenizer,
)
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import Params, declared_params
from minigpt_jax.model.layers import NORM_EPS
from minigpt_jax.settings.groups import declarations

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
# A run exported with a character-level tokenizer, which has no Hugging Face form, keeps it here.
RUN_TOKENIZER_FILE = "minigpt_tokenizer.json"

# GPT-2's activation_function values: "gelu_new" and "gelu_pytorch_tanh" are the tanh GELU,
# "gelu" the exact erf GELU.
_GELU_APPROXIMATE = {"gelu_new": True, "gelu_pytorch_tanh": True, "gelu": False}
# Causal-mask buffers that older GPT-2 checkpoints store; they hold no parameters.
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")


class GPT2CheckpointError(ValueError):
    """A Hugging Face checkpoint that is missing, damaged or not a GPT-2 this package can run."""


# ----------------------------------------------------------------------------- config.json


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise GPT2CheckpointError(f"{path} cannot be read as JSON ({error}).") from error


def gpt_config_from_hf(hf: dict, where: str = CONFIG_FILE) -> GPTConfig:
    """The GPTConfig of a GPT-2 `config.json` dict; refuses settings this model cannot run."""
    model_type = hf.get("model_type")
    if model_type != "gpt2":
        raise GPT2CheckpointError(
            f"{where} describes model_type={model_type!r}, not 'gpt2': only GPT-2 checkpoints "
            f"(GPT2LMHeadModel) map onto this package's model."
        )
    activation = hf.get("activation_function", "gelu_new")
    if activation not in _GELU_APPROXIMATE:
        raise GPT2CheckpointError(
            f"{where}: activation_function={activation!r} is not supported; "
            f"allowed: {sorted(_GELU_APPROXIMATE)}."
        )
    eps = hf.get("layer_norm_epsilon", 1e-5)
    if not math.isclose(eps, NORM_EPS, rel_tol=1e-6):
        raise GPT2CheckpointError(
            f"{where}: layer_norm_epsilon={eps} but this model's LayerNorms use "
            f"{NORM_EPS} (GPT-2's value)."
        )
    for key, expected in (
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
    ):
        if hf.get(key, expected) != expected:
            raise GPT2CheckpointError(
                f"{where}: {key}={hf[key]!r} changes the attention this model computes; only "
                f"{key}={expected} is supported."
            )
    n_embd = hf.get("n_embd", 768)
    n_inner = hf.get("n_inner") or 4 * n_embd  # any width: F = round(mlp_ratio * D)
    try:
        return GPTConfig(
            vocab_size=hf.get("vocab_size", 50257),
            block_size=hf.get("n_positions", 1024),
            n_layer=hf.get("n_layer", 12),
            n_head=hf.get("n_head", 12),
            n_embd=n_embd,
            mlp_ratio=n_inner / n_embd,
            dropout=hf.get("resid_pdrop", 0.1),
            pos_encoding="learned",
            tie_embeddings=hf.get("tie_word_embeddings", True),
            use_bias=True,
            gelu_approximate=_GELU_APPROXIMATE[activation],
        )
    except ValueError as error:
        raise GPT2CheckpointError(f"{where}: {error}") from error


def hf_config_from(cfg: GPTConfig, eos_token_id: int | None = None) -> dict:
    """The `config.json` dict of a GPT2LMHeadModel with cfg's shape and settings."""
    check_exportable(cfg)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.mlp_dim,
        "activation_function": "gelu_new" if cfg.gelu_approximate else "gelu",
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "layer_norm_epsilon": NORM_EPS,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "dtype": "float32",
    }


def check_exportable(cfg: GPTConfig) -> None:
    """Raises ValueError when GPT-2's architecture cannot express cfg: a setting declared with
    the value GPT-2's layout needs (`settings.Setting.gpt2`) holds another."""
    problems = [
        f"{name}={getattr(cfg, name)!r} (GPT-2 has {spec.gpt2!r})"
        for name, spec in declarations(GPTConfig).items()
        if spec.needs_gpt2_value and getattr(cfg, name) != spec.gpt2
    ]
    if problems:
        raise ValueError(
            "this model has no GPT-2 form: " + "; ".join(problems) + ". Only models with "
            "these settings at GPT-2's values export to the Hugging Face GPT-2 layout."
        )


# ----------------------------------------------------------------------------- tensors


def _tensor_names(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """GPT-2's tensor names (without the `transformer.` prefix) and their shapes for cfg."""
    d, f = cfg.n_embd, cfg.mlp_dim
    shapes = {"wte.weight": (cfg.vocab_size, d), "wpe.weight": (cfg.block_size, d)}
    for i in range(cfg.n_layer):
        for name, shape in (
            ("ln_1.weight", (d,)),
            ("ln_1.bias", (d,)),
            ("attn.c_attn.weight", (d, 3 * d)),
            ("attn.c_attn.bias", (3 * d,)),
            ("attn.c_proj.weight", (d, d)),
            ("attn.c_proj.bias", (d,)),
            ("ln_2.weight", (d,)),
            ("ln_2.bias", (d,)),
            ("mlp.c_fc.weight", (d, f)),
            ("mlp.c_fc.bias", (f,)),
            ("mlp.c_proj.weight", (f, d)),
            ("mlp.c_proj.bias", (d,)),
        ):
            shapes[f"h.{i}.{name}"] = shape
    shapes["ln_f.weight"] = (d,)
    shapes["ln_f.bias"] = (d,)
    return shapes


# GPT-2 names its norms by their module: block_{i}/ln_1/scale is h.{i}.ln_1.weight.
_NORMS = ("ln_1", "ln_2", "ln_f")
_NORM_LEAVES = {"scale": "weight", "bias": "bias"}


def gpt2_names(cfg: GPTConfig) -> dict[tuple[str, ...], tuple[str, bool, tuple[int, ...]]]:
    """{parameter path: (GPT-2 tensor name, stored transposed, the parameter's shape)}, from
    the names each parameter declares (`param_meta.declare(gpt2=)`, "{i}" its layer); the
    norms are named by their module. Raises ValueError for a parameter GPT-2 has no name for."""
    names = {}
    for path, (shape, meta) in declared_params(cfg).items():
        layer = path[0].removeprefix("block_") if path[0].startswith("block_") else None
        if meta.gpt2 is not None:
            name = meta.gpt2.format(i=layer)
        elif len(path) >= 2 and path[-2] in _NORMS and path[-1] in _NORM_LEAVES:
            prefix = path[-2] if layer is None else f"h.{layer}.{path[-2]}"
            name = f"{prefix}.{_NORM_LEAVES[path[-1]]}"
        else:
            raise ValueError(
                f"parameter {'/'.join(path)} has no GPT-2 name: declare one where it is created "
                f"(param_meta.declare(..., gpt2='h.{{i}}.<module>.weight')), or keep the model "
                f"in this package's checkpoints (GPT-2's layout has no place for it)."
            )
        names[path] = (name, meta.gpt2_transpose, shape)
    return names


def _put(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _at(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def params_from_hf(tensors: dict[str, np.ndarray], cfg: GPTConfig) -> Params:
    """The params pytree of GPT-2 `tensors` (names without the `transformer.` prefix), each
    parameter read from the GPT-2 tensor it declares (`gpt2_names`), reshaped to its shape."""
    params: dict = {}
    for path, (name, transposed, shape) in gpt2_names(cfg).items():
        value = tensors[name].T if transposed else tensors[name]
        _put(params, path, value.reshape(shape))
    return params


def hf_tensors_from(params: Params, cfg: GPTConfig) -> dict[str, np.ndarray]:
    """GPT-2's float32 tensors, named as `save_pretrained` names them, from a params pytree
    (each parameter to the GPT-2 tensor it declares, `gpt2_names`; the vocabulary padding cut).

    A model without biases gets zero biases, which compute the same function.
    """
    expected = _tensor_names(cfg)
    if not cfg.tie_embeddings:
        expected["lm_head.weight"] = (cfg.vocab_size, cfg.n_embd)
    tensors = {}
    for path, (name, transposed, _) in gpt2_names(cfg).items():
        value = np.asarray(_at(params, path), np.float32)
        value = value.T if transposed else value
        if name in ("wte.weight", "lm_head.weight"):
            value = value[: cfg.vocab_size]  # no padding
        tensors[name] = np.ascontiguousarray(value.reshape(expected[name]))
    for name, shape in expected.items():
        if name not in tensors and name.endswith(".bias"):  # a model without biases
            tensors[name] = np.zeros(shape, np.float32)
    out = {
        f"transformer.{name}": value for name, value in tensors.items() if name != "lm_head.weight"
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = tensors["lm_head.weight"]
    return out


def _weight_files(directory: Path) -> list[Path]:
    single, index = directory / WEIGHTS_FILE, directory / WEIGHTS_INDEX_FILE
    if single.is_file():
        return [single]
    if index.is_file():
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if not shards or missing:
            raise GPT2CheckpointError(
                f"{index} lists shard files that are not in {directory}: {missing or 'none'}; "
                f"copy every shard next to it."
            )
        return [directory / s for s in shards]
    others = sorted(p.name for p in directory.glob("*.bin")) + sorted(
        p.name for p in directory.glob("*.h5")
    )
    raise GPT2CheckpointError(
        f"{directory} has no {WEIGHTS_FILE}"
        + (f" (only {', '.join(others)}, which needs torch to read)" if others else "")
        + ": save the model with `GPT2LMHeadModel.save_pretrained(dir)` (safetensors is its "
        "default), or download model.safetensors with the model."
    )


def _read_tensors(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as a numpy array, names stripped of `transformer.`."""
    from safetensors import SafetensorError, safe_open

    tensors = {}
    for path in _weight_files(directory):
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():
                    tensors[name.removeprefix("transformer.")] = f.get_tensor(name)
        except (SafetensorError, OSError) as error:
            raise GPT2CheckpointError(
                f"{path} is not a readable safetensors file ({error}); download it again."
            ) from error
    return tensors


def _check_tensors(tensors: dict[str, np.ndarray], cfg: GPTConfig, directory: Path) -> None:
    expected = _tensor_names(cfg)
    if not cfg.tie_embeddings:
        expected["lm_head.weight"] = (cfg.vocab_size, cfg.n_embd)
    for name, shape in expected.items():
        if name not in tensors:
            raise GPT2CheckpointError(
                f"{directory}: tensor {name!r} is missing; the checkpoint is incomplete or its "
                f"config.json does not describe it (n_layer={cfg.n_layer})."
            )
        if tuple(tensors[name].shape) != shape:
            raise GPT2CheckpointError(
                f"{directory}: tensor {name!r} has shape {tuple(tensors[name].shape)}, but "
                f"config.json implies {shape}; the weights and config.json do not belong together."
            )
    if cfg.tie_embeddings and "lm_head.weight" in tensors:
        if not np.array_equal(tensors["lm_head.weight"], tensors["wte.weight"]):
            raise GPT2CheckpointError(
                f"{directory}: config.json says tie_word_embeddings=true, but lm_head.weight "
                f"differs from wte.weight; set tie_word_embeddings=false in config.json to load "
                f"the separate head."
            )
    unexpected = sorted(
        name
        for name in tensors
        if name not in expected and name != "lm_head.weight" and not name.endswith(_BUFFER_SUFFIXES)
    )
    if unexpected:
        raise GPT2CheckpointError(
            f"{directory}: tensors {unexpected[:5]} are not part of a GPT-2 with "
            f"n_layer={cfg.n_layer}; the checkpoint belongs to another architecture or config."
        )


# ----------------------------------------------------------------------------- public API


def existing_dir(path: str | Path) -> Path:
    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(
            f"{directory} does not exist: give a local directory holding a Hugging Face GPT-2 "
            f"checkpoint ({CONFIG_FILE} + {WEIGHTS_FILE}); nothing is downloaded."
        )
    if not directory.is_dir():
        raise GPT2CheckpointError(f"{directory} is a file; give the directory that holds it.")
    return directory


def load_gpt2(path: str | Path) -> tuple[GPTConfig, Params]:
    """(cfg, params) of the Hugging Face GPT-2 checkpoint in directory `path`, in float32."""
    directory = existing_dir(path)
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise GPT2CheckpointError(
            f"{directory} has no {CONFIG_FILE}: it is not a Hugging Face model directory."
        )
    cfg = gpt_config_from_hf(_read_json(config_path), str(config_path))
    tensors = _read_tensors(directory)
    _check_tensors(tensors, cfg, directory)
    params = params_from_hf(tensors, cfg)
    return cfg, jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)


def save_gpt2(
    params: Params, cfg: GPTConfig, path: str | Path, tokenizer: Tokenizer | None = None
) -> Path:
    """Writes params as a Hugging Face GPT-2 directory that `transformers` opens unchanged.

    Writes config.json and model.safetensors (float32); with a byte-level BPE tokenizer also
    tokenizer.json, vocab.json, merges.txt and tokenizer_config.json. A character-level tokenizer
    has no Hugging Face form: it is saved as minigpt_tokenizer.json, which `load_model` reads.
    """
    from safetensors.numpy import save_file

    check_exportable(cfg)
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.eot_id if isinstance(tokenizer, BPETokenizer) else None
    (directory / CONFIG_FILE).write_text(
        json.dumps(hf_config_from(cfg, eos), indent=2) + "\n", encoding="utf-8"
    )
    save_file(hf_tensors_from(params, cfg), str(directory / WEIGHTS_FILE), {"format": "pt"})
    if isinstance(tokenizer, BPETokenizer):
        tokenizer.save_gpt2_files(directory, model_max_length=cfg.block_size)
    elif tokenizer is not None:
        tokenizer.save(directory / RUN_TOKENIZER_FILE)
    return directory


def is_gpt2_dir(path: str | Path) -> bool:
    """Whether `path` looks like a Hugging Face model directory (has config.json)."""
    return (Path(path) / CONFIG_FILE).is_file()
