"""What may change when a run resumes: the model never, the trajectory only when asked.

A checkpoint's meta records the GPTConfig and the experiment config it was trained with, every
registry name included (a `module:attr` entry must still import to resume); these checks compare
them with the resuming run before anything is restored. Which settings may differ follows from
each setting's declared kind (minigpt_jax.settings.groups): MODEL settings must match, SPEED and
BOOKKEEPING ones are free (num_steps may grow: the schedule is then stretched from the resumed
step on), TRAJECTORY ones are refused unless asked. The data itself is checked too: a checkpoint
records the digest of the token stream it trained on (data.DataDigest), and another stream (an
input edited, added or removed) is refused unless asked, like a trajectory setting; and the
sha256 of every user module its `module:attr` keys import (edited plug-in code: the same).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minigpt_jax.config_dict import declaration, entry_settings
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.settings.groups import MODEL, SPEED, TRAJECTORY, declarations

# GPTConfig fields that pick how the same model is computed (same params, same math within
# float tolerance): a run may resume with other values, e.g. on another backend.
SPEED_FIELDS = tuple(name for name, s in declarations(GPTConfig).items() if s.kind == SPEED)


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _differences(saved: dict, current: dict, keep=lambda key: True, prefix: str = "") -> list:
    """'key: saved -> current' for every kept leaf that differs, nested dicts flattened with
    dots. A key the checkpoint does not record is a setting added to minigpt-jax after it was
    written; its default keeps the old behaviour, so it is not a difference (older run
    directories still resume)."""
    saved, current = _flatten(saved), _flatten(current)
    return [
        f"{prefix}{key}: {saved[key]!r} -> {current.get(key)!r}"
        for key in sorted(saved)
        if keep(key) and saved[key] != current.get(key)
    ]


def _entry_kinds(config: dict) -> dict[str, str]:
    """{"group.name": kind} of the settings the config's picked entries declare."""
    return {
        f"{group}.{name}": field.metadata["setting"].kind
        for group, names in entry_settings(config).items()
        for name, (field, _) in names.items()
    }


def _is_trajectory(dotted: str, entry_kinds: dict[str, str]) -> bool:
    spec = declaration(dotted)
    kind = entry_kinds.get(dotted) if spec is None else spec.kind
    return kind == TRAJECTORY


def check_resume(
    saved_meta: dict, meta: dict, checkpoint_dir: str | Path, *, allow_changes: bool = False
) -> list[str]:
    """Raises ValueError if the checkpoint at checkpoint_dir cannot continue this run.

    saved_meta / meta: {'gpt_config': ..., 'config': ...} of the checkpoint and of this run.
    A model difference is always an error (SPEED_FIELDS are not the model). A trajectory
    difference is an error unless allow_changes; then the accepted differences are returned
    for the caller to report.
    """
    # Entry-owned settings are compared in the config below, each by its declared kind.
    model = _differences(
        saved_meta.get("gpt_config", {}),
        meta["gpt_config"],
        lambda key: key not in SPEED_FIELDS and key != "entry_settings",
    )
    saved_config = saved_meta.get("config")
    entry_kinds = _entry_kinds(meta["config"])
    if saved_config is not None:
        model += _differences(
            saved_config, meta["config"], lambda key: entry_kinds.get(key) == MODEL, "config."
        )
    if model:
        raise ValueError(
            f"{checkpoint_dir} holds a different model than this config builds ("
            + "; ".join(model)
            + "). Use the saved settings to resume it, or a fresh --workdir for the new model."
        )
    if saved_config is None:  # written before configs were recorded: nothing to compare
        return []
    trajectory = _differences(
        saved_config, meta["config"], lambda key: _is_trajectory(key, entry_kinds), "config."
    )
    if trajectory and not allow_changes:
        raise ValueError(
            f"{checkpoint_dir} was trained with other settings ("
            + "; ".join(trajectory)
            + "), so resuming would not continue the same run. Rerun with the saved values, "
            "use a fresh --workdir, or pass --allow_resume_changes to continue with the new ones."
        )
    return trajectory + schedule_change(saved_config, meta["config"])


def schedule_change(saved_config: dict, config: dict) -> list[str]:
    """The words for a changed num_steps that reshapes the learning-rate schedule (every
    schedule but a constant one spans num_steps), for the resume to name; [] if none."""
    old, new = saved_config.get("num_steps"), config.get("num_steps")
    schedule = config.get("optim", {}).get("schedule", "cosine")
    if old is None or old == new or schedule == "constant":
        return []
    return [
        f"config.num_steps: {old} -> {new}, which reshapes the {schedule} learning-rate schedule "
        f"from here on (it spans num_steps): the run no longer matches an uninterrupted run of "
        f"either length"
    ]


def check_resume_data(
    saved: dict | None,
    current: dict,
    checkpoint_dir: str | Path,
    *,
    where: str,
    allow_changes: bool = False,
) -> str | None:
    """Raises ValueError if the checkpoint at checkpoint_dir trained on another token stream.

    saved / current: the DataDigest.as_dict() of the checkpoint's data (None: written before
    digests were recorded, nothing to compare) and of this run's; `where` names the data in
    the message. With allow_changes the difference is returned for the caller to report (the
    old validation split is gone, so its best val loss no longer compares); None if the same.
    """
    if saved is None or [saved.get(k) for k in ("tokens", "sha256")] == [
        current["tokens"],
        current["sha256"],
    ]:
        return None
    change = (
        f"the token stream of {where}: {saved.get('tokens', 0):,} tokens, sha256 "
        f"{saved.get('sha256', '?')[:12]} -> {current['tokens']:,} tokens, sha256 "
        f"{current['sha256'][:12]}"
    )
    if not allow_changes:
        raise ValueError(
            f"{checkpoint_dir} was trained on other data ({change}): an input was edited, added "
            "or removed since. Restore the input, use a fresh --workdir, or pass "
            "--allow_resume_changes to continue on the new data (its best val loss then starts "
            "afresh: the old validation split is gone)."
        )
    return change


def check_resume_plugins(
    saved: dict[str, str] | None,
    current: dict[str, str],
    keys: dict[str, list[str]],
    checkpoint_dir: str | Path,
    *,
    allow_changes: bool = False,
) -> list[str]:
    """Raises ValueError if a user module the run imports (registry.user_module_digests) has
    another source than the checkpoint's; with allow_changes returns the changes to report.

    saved / current: {module: sha256} of the checkpoint (None: written before digests were
    recorded, nothing to compare) and of this run; keys: {module: [picking keys]} for the
    message. A module only one side imports is a config difference, checked with the config.
    """
    if saved is None:
        return []
    changes = [
        f"module {module} (sha256 {saved[module][:12]} -> {current[module][:12]}; "
        f"{', '.join('config.' + key for key in keys.get(module, []))})"
        for module in sorted(saved)
        if module in current and saved[module] != current[module]
    ]
    if changes and not allow_changes:
        raise ValueError(
            f"{checkpoint_dir} was trained with other plug-in code: the source of "
            + "; ".join(changes)
            + " was edited since, so resuming would not continue the same run. Restore the "
            "module, use a fresh --workdir, or pass --allow_resume_changes to continue with "
            "the new code."
        )
    return [f"plug-in source {change}" for change in changes]
