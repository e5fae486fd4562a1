"""What may change when a run resumes: the model never, the trajectory only when asked.

A checkpoint's meta records the GPTConfig and the experiment config it was trained with; these
checks compare them with the resuming run before anything is restored.
"""

from __future__ import annotations

from pathlib import Path

# The settings that decide which batches, updates and dropout masks a run sees. Changing one
# on resume silently makes a different run; num_steps may grow (the cosine schedule is then
# stretched from the resumed step on), and speed settings (steps_per_call, mesh) may change.
TRAJECTORY_KEYS = ("seed", "batch_size", "data", "optim")

# GPTConfig fields that pick how the same model is computed (same params, same math within
# float tolerance): a run may resume with other values, e.g. on another backend.
SPEED_FIELDS = ("dense_grad", "attention", "loss_chunk", "remat")


def _differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """'key: saved -> current' for every leaf that differs, nested dicts flattened with dots.

    A key the checkpoint does not record is a setting added to minigpt-jax after it was
    written; its default keeps the old behaviour, so it is not a difference (older run
    directories still resume)."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if key not in saved:
            continue
        old, new = saved.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            out.append(f"{prefix}{key}: {old!r} -> {new!r}")
    return out


def check_resume(
    saved_meta: dict, meta: dict, checkpoint_dir: str | Path, *, allow_changes: bool = False
) -> list[str]:
    """Raises ValueError if the checkpoint at checkpoint_dir cannot continue this run.

    saved_meta / meta: {'gpt_config': ..., 'config': ...} of the checkpoint and of this run.
    A model difference is always an error (SPEED_FIELDS are not the model). A trajectory
    difference (TRAJECTORY_KEYS) is an error unless allow_changes; then the accepted
    differences are returned for the caller to report.
    """
    model = _differences(
        {k: v for k, v in saved_meta.get("gpt_config", {}).items() if k not in SPEED_FIELDS},
        {k: v for k, v in meta["gpt_config"].items() if k not in SPEED_FIELDS},
    )
    if model:
        raise ValueError(
            f"{checkpoint_dir} holds a different model than this config builds ("
            + "; ".join(model)
            + "). Use the saved settings to resume it, or a fresh --workdir for the new model."
        )
    saved_config = saved_meta.get("config")
    if saved_config is None:  # written before configs were recorded: nothing to compare
        return []
    trajectory = _differences(
        {k: saved_config.get(k) for k in TRAJECTORY_KEYS},
        {k: meta["config"].get(k) for k in TRAJECTORY_KEYS},
        "config.",
    )
    if trajectory and not allow_changes:
        raise ValueError(
            f"{checkpoint_dir} was trained with other settings ("
            + "; ".join(trajectory)
            + "), so resuming would not continue the same run. Rerun with the saved values, "
            "use a fresh --workdir, or pass --allow_resume_changes to continue with the new ones."
        )
    return trajectory
