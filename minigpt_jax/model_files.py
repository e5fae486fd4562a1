"""A trained model from a path: a run directory (its checkpoint and tokenizer) or a Hugging Face
GPT-2 directory (`load_model`), a run written out as GPT-2 (`export_run`), and a loaded model
shaped for a fine-tuning config (`params_for`)."""

from __future__ import annotations

import errno
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp

from minigpt_jax.data.tokenizers import (
    Tokenizer,
    has_gpt2_tokenizer_files,
    load_gpt2_tokenizer,
    load_tokenizer,
)
from minigpt_jax.gpt2 import (
    CONFIG_FILE,
    RUN_TOKENIZER_FILE,
    WEIGHTS_FILE,
    GPT2CheckpointError,
    existing_dir,
    is_gpt2_dir,
    load_gpt2,
    save_gpt2,
)
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import Params
from minigpt_jax.model.positions import POSITION_ENCODINGS
from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.runtime.run_dir import RunDir
from minigpt_jax.settings.groups import SPEED, declarations
from minigpt_jax.settings.registry import changed_user_modules, is_user_key

_log = logging.getLogger(__name__)


class LoadedModel(NamedTuple):
    """A model ready to run: its config, params and the tokenizer its ids belong to."""

    cfg: GPTConfig
    params: Params
    tokenizer: Tokenizer


def load_run(workdir: str | Path, checkpoint: str = "latest") -> LoadedModel:
    """(cfg, params, tokenizer) of a run's workdir: its checkpoint ('latest' or 'best') and the
    tokenizer `minigpt-jax train` saved beside it."""
    params, meta = load_params(workdir, checkpoint)
    _warn_if_plugins_changed(workdir, meta.get("plugins") or {})
    cfg = GPTConfig(**meta["gpt_config"])
    tokenizer_path = RunDir(workdir).tokenizer
    if not tokenizer_path.exists():
        raise FileNotFoundError(
            f"{tokenizer_path} is missing: use the workdir of a run made by "
            "`minigpt-jax train`, which saves its tokenizer there."
        )
    return LoadedModel(cfg, params, load_tokenizer(tokenizer_path))


def _warn_if_plugins_changed(workdir: str | Path, recorded: dict[str, str]) -> None:
    """Warns (one line) when a module of the user's own that the run imported
    (registry.user_module_digests, recorded in its checkpoint) was edited since: the model may
    then compute something else than it was trained with. `train` refuses to resume on it;
    sampling, evaluating and exporting go on, since a comment-only edit changes the digest too."""
    changed = changed_user_modules(recorded)
    if changed:
        _log.warning(
            "%s was trained with other plug-in code: the source of %s changed since; the model "
            "may compute something else than it was trained with (restore the module to get "
            "the trained model back).",
            workdir,
            "; ".join(changed),
        )


def load_model(path: str | Path, checkpoint: str = "latest") -> LoadedModel:
    """(cfg, params, tokenizer) of a Hugging Face GPT-2 directory or of a run's workdir.

    checkpoint ('latest' or 'best') applies to a run's workdir only.
    """
    directory = existing_dir(path)
    if is_gpt2_dir(directory):
        cfg, params = load_gpt2(directory)
        if has_gpt2_tokenizer_files(directory):
            tokenizer = load_gpt2_tokenizer(directory)
        elif (directory / RUN_TOKENIZER_FILE).is_file():
            tokenizer = load_tokenizer(directory / RUN_TOKENIZER_FILE)
        else:
            raise GPT2CheckpointError(
                f"{directory} has weights but no tokenizer: add GPT-2's tokenizer.json, or "
                f"vocab.json + merges.txt, from the same model."
            )
    elif RunDir(directory).has_checkpoints():
        cfg, params, tokenizer = load_run(directory, checkpoint)
    else:
        raise GPT2CheckpointError(
            f"{directory} is neither a Hugging Face GPT-2 directory ({CONFIG_FILE} + "
            f"{WEIGHTS_FILE}) nor a run directory (checkpoints/): point at one of those."
        )
    if tokenizer.vocab_size > cfg.vocab_size:
        raise GPT2CheckpointError(
            f"{directory}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
            f"{cfg.vocab_size}; the tokenizer files belong to another model."
        )
    return LoadedModel(cfg, params, tokenizer)


def export_run(workdir: str | Path, out: str | Path, checkpoint: str = "latest") -> Path:
    """Writes a run's checkpoint and tokenizer as a Hugging Face GPT-2 directory `out`."""
    if is_gpt2_dir(workdir):
        raise ValueError(f"{workdir} is already a Hugging Face directory; copy it instead.")
    cfg, params, tokenizer = load_model(workdir, checkpoint)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not empty: choose a new --out directory.")
    # Written into a sibling folder and renamed into place: `out` is complete or absent.
    out.parent.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(part, 0o777 & ~umask)  # mkdtemp's 0700 would outlive the rename
        save_gpt2(params, cfg, part, tokenizer)
        os.replace(part, out)  # an empty `out` is replaced
    except BaseException as error:
        shutil.rmtree(part, ignore_errors=True)
        if _no_space(error):
            raise OSError(
                errno.ENOSPC,
                f"no space left on the device of {out.parent} while writing {out} (about "
                f"{_weights_bytes(params) / 2**20:,.1f} MiB of weights); nothing was left "
                "behind: free some space, then rerun the same command",
            ) from None
        raise
    return out


def _no_space(error: BaseException) -> bool:
    """Whether a write failed for want of space (safetensors says so only in its message)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left" in str(error) or "Disk quota exceeded" in str(error)


def _weights_bytes(params: Params) -> int:
    return sum(4 * math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params))


def shape_mismatch(loaded: GPTConfig, wanted: GPTConfig) -> list[str]:
    """The fields where a checkpoint's model differs from a config's, beyond what fine-tuning
    may change (dropout, dtypes, the speed settings, the vocabulary padding, and a shorter
    block_size, which crops positions). A field whose config value names a plug-in
    (module:attr) may differ: the plug-in may wrap the built-in and add parameters, which
    `finetune.new_parameters` then matches by path. Of the picked entries' own settings
    (entry_settings) only those both models declare are compared, by the same rules: a
    plug-in's new settings are its own."""
    specs = declarations(GPTConfig)
    free = {name for name, spec in specs.items() if spec.finetune_free or spec.kind == SPEED}
    diffs = []
    for name in GPTConfig.__dataclass_fields__:
        have, want = getattr(loaded, name), getattr(wanted, name)
        if name == "entry_settings" or name in free or have == want:
            continue
        if not (isinstance(want, str) and is_user_key(want)):
            diffs.append(f"{name}: checkpoint {have!r}, config {want!r}")
    diffs += _entry_settings_mismatch(loaded, wanted)
    learned = POSITION_ENCODINGS[loaded.pos_encoding].learned
    if wanted.block_size > loaded.block_size and learned:
        diffs.append(
            f"block_size: config {wanted.block_size} exceeds the checkpoint's learned "
            f"{loaded.block_size} positions"
        )
    return diffs


def _entry_settings_mismatch(loaded: GPTConfig, wanted: GPTConfig) -> list[str]:
    """The picked entries' settings that both models declare and that differ, but those
    declared SPEED or finetune_free."""
    shared = loaded.declared_entry_settings().keys() & wanted.declared_entry_settings().keys()
    have, want = loaded.flat_values(), wanted.flat_values()
    diffs = []
    for name in sorted(shared):
        spec = wanted.declared_entry_settings()[name].metadata.get("setting")
        if spec is not None and (spec.finetune_free or spec.kind == SPEED):
            continue
        if have[name] != want[name]:
            diffs.append(f"{name}: checkpoint {have[name]!r}, config {want[name]!r}")
    return diffs


def check_fits(loaded: GPTConfig, wanted: GPTConfig) -> None:
    """Raises ValueError naming the fields when a checkpoint's model cannot become `wanted`."""
    diffs = shape_mismatch(loaded, wanted)
    if diffs:
        raise ValueError(
            "the config's model does not match the checkpoint's: "
            + "; ".join(diffs)
            + ". Set those --config.model fields to the checkpoint's values."
        )


def params_for(loaded: LoadedModel, wanted: GPTConfig) -> Params:
    """The loaded params shaped for `wanted`: the learned position table cropped to its
    block_size (nanoGPT's crop_block_size). Raises ValueError when the shapes cannot match."""
    check_fits(loaded.cfg, wanted)
    params = loaded.params
    if "pos" in params["embed"]:
        pos = {"embedding": params["embed"]["pos"]["embedding"][: wanted.block_size]}
        params = {**params, "embed": {**params["embed"], "pos": pos}}
    # The vocabulary padding of `wanted` (zero rows, never used), whatever the checkpoint's.
    pad = wanted.padded_vocab_size - wanted.vocab_size
    table_VxD = params["embed"]["tok"]["embedding"][: wanted.vocab_size]
    tok = {"embedding": jnp.pad(table_VxD, ((0, pad), (0, 0)))}
    params = {**params, "embed": {**params["embed"], "tok": tok}}
    if "lm_head" in params:
        kernel_DxV = params["lm_head"]["kernel"][:, : wanted.vocab_size]
        params = {**params, "lm_head": {"kernel": jnp.pad(kernel_DxV, ((0, 0), (0, pad)))}}
    return jax.tree_util.tree_map(lambda x: x.astype(wanted.weight_dtype), params)
