"""The command line, `minigpt-jax train|sample|lab` (also `python -m minigpt_jax`): flags only.

  minigpt-jax train  --config configs/X.py [--config.key=value ...] --workdir runs/X
  minigpt-jax sample --workdir runs/X --prompt "ROMEO:" --max_new_tokens 500 \
                     [--temperature 0.8] [--top_k 200] [--top_p 0.95] [--seed 0] [--num_samples 3]
  minigpt-jax lab    [--port 7860] [--open] [--lang en|es]      (needs the `lab` extra)
"""

from __future__ import annotations

import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

COMMANDS = ("train", "sample", "lab")

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, e.g. configs/default.py.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, tokenizer.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
_PROMPT = flags.DEFINE_string("prompt", "\n", "sample: text to continue.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 500, "sample: tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "sample: softmax temperature; 0 = greedy.")
_TOP_K = flags.DEFINE_integer("top_k", None, "sample: keep only the k most likely tokens.")
_TOP_P = flags.DEFINE_float("top_p", None, "sample: keep the smallest set with mass >= p.")
_SEED = flags.DEFINE_integer("seed", 0, "sample: random seed.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "sample: independent samples to print.")
_CHECKPOINT = flags.DEFINE_enum("checkpoint", "latest", ["latest", "best"], "sample: which one.")
_PORT = flags.DEFINE_integer("port", None, "lab: port on 127.0.0.1; default: a free one.")
_OPEN = flags.DEFINE_bool("open", False, "lab: open the page in the default browser.")
_LANG = flags.DEFINE_enum("lang", "en", ["en", "es"], "lab: the page's language.")


def _train() -> None:
    from minigpt_jax.sharding import exit_when_a_process_is_lost, initialize_distributed
    from minigpt_jax.train import train_and_evaluate

    if _CONFIG.value is None:
        raise app.UsageError("train needs --config, e.g. --config configs/default.py.")
    initialize_distributed()  # multi-host runs only: see minigpt_jax/sharding.py
    with exit_when_a_process_is_lost(_WORKDIR.value):
        summary = train_and_evaluate(_CONFIG.value, _WORKDIR.value, progress=_PROGRESS.value)
    fmt = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
    print(
        f"step {summary.step}: train loss {fmt(summary.eval_train_loss)}, "
        f"val loss {fmt(summary.val_loss)} (best {fmt(summary.best_val_loss)}); "
        f"wall {summary.wall_time_s:.1f} s, compile {summary.compile_time_s:.1f} s, "
        f"median {fmt(summary.median_step_ms)} ms/step"
        + (f"; resumed from step {summary.resumed_from}" if summary.resumed_from else "")
        + (f"; stopped by {summary.interrupted_by}" if summary.interrupted_by else "")
    )


def _sample() -> None:
    from minigpt_jax.runs import sample_from_workdir

    texts = sample_from_workdir(
        _WORKDIR.value,
        _PROMPT.value,
        max_new_tokens=_MAX_NEW_TOKENS.value,
        temperature=_TEMPERATURE.value,
        top_k=_TOP_K.value,
        top_p=_TOP_P.value,
        seed=_SEED.value,
        num_samples=_NUM_SAMPLES.value,
        checkpoint=_CHECKPOINT.value,
    )
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"---------- sample {i + 1}/{len(texts)}")
        print(text)


def _lab() -> None:
    try:
        from minigpt_jax.lab.app import launch
    except ImportError as error:
        raise RuntimeError(
            f"the lab needs the `lab` extra ({error}); install it with pip install -e '.[lab]'."
        ) from None
    launch(port=_PORT.value, open_browser=_OPEN.value, lang=_LANG.value)


def _run(argv: list[str]) -> None:
    commands = [a for a in argv[1:] if not a.startswith("-")]
    if len(commands) != 1 or commands[0] not in COMMANDS:
        raise app.UsageError(f"name one command: {' | '.join(COMMANDS)}; got {commands or 'none'}.")
    if _WORKDIR.value is None and commands[0] != "lab":
        raise app.UsageError("--workdir is required, e.g. --workdir runs/default.")
    try:
        {"train": _train, "sample": _sample, "lab": _lab}[commands[0]]()
    except (ValueError, TypeError, FileNotFoundError, FloatingPointError, RuntimeError) as error:
        # Errors of ours already say what is wrong and how to fix it; a traceback adds nothing.
        if type(error).__module__.startswith(("jax", "flax", "orbax")):
            raise
        sys.exit(f"minigpt-jax {commands[0]}: error: {error}")


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parser, with a config-key typo turned into a message listing the valid keys."""
    config_path = _config_path(argv)
    if config_path:
        from minigpt_jax.run_config import add_config_root_to_path

        add_config_root_to_path(config_path.split(":")[0])
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as error:
        from minigpt_jax.run_config import unknown_key_message

        for arg in argv:
            match = re.match(r"--config\.([\w.]+)", arg)
            if match and _key_missing(argv, match.group(1)):
                path, _, key = match.group(1).rpartition(".")
                sys.exit(f"minigpt-jax: error: {unknown_key_message(path, key)}")
        raise error
    except flags.Error as error:
        sys.exit(f"minigpt-jax: error: {error}\nRun `minigpt-jax --help` for the flags.")


def _key_missing(argv: list[str], dotted: str) -> bool:
    """Whether `dotted` names no key of the --config file's get_config()."""
    from minigpt_jax.run_config import load_config_file

    path = _config_path(argv)
    if path is None:
        return True
    node = load_config_file(path.split(":")[0])
    for part in dotted.split("."):
        if not hasattr(node, "keys") or part not in node:
            return True
        node = node[part]
    return False


def _config_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def main() -> None:
    logging.set_verbosity(logging.WARNING)  # absl INFO lines (e.g. "no TPU found") are noise here
    app.run(_run, flags_parser=_parse_flags)


if __name__ == "__main__":
    main()
