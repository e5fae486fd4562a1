r"""The command line, `minigpt-jax train|prepare|sample|export|eval|settings` and the commands
other packages add (`lab`, `sweep`, `compare` from minigpt_apps; also `python -m minigpt_jax`):
the flags, each command's call, its errors as one line and its exit statuses.

  minigpt-jax train   --config configs/X.py [--config.key=value ...] --workdir runs/X
                      [--config.init_from=HF_GPT2_DIR_OR_RUN] [--allow_resume_changes]
  minigpt-jax prepare --config configs/X.py [--config.key=value ...] --workdir runs/X
                      (token shards of config.data in data.shards_dir, default runs/X/shards;
                       train with data.format=shards prepares them itself when missing or stale)
  minigpt-jax sample (--workdir runs/X | --pretrained HF_GPT2_DIR) --prompt "ROMEO:" \
                     --max_new_tokens 500 [--temperature 0.8] [--top_k 200] [--top_p 0.95] \
                     [--seed 0] [--num_samples 3] [--samples_per_batch 64]
                     (text streams as it comes; Ctrl-C or SIGTERM stops it with what was sampled)
  minigpt-jax export --workdir runs/X --out HF_GPT2_DIR
  minigpt-jax eval   (--workdir runs/X | --pretrained HF_GPT2_DIR) --text FILE.txt [--stride 512]
  minigpt-jax settings [--config configs/X.py [--config.key=value ...]]
                      (every config key: default, kind and doc, and the settings entries
                       declare; with --config, that config's resolved values)
  minigpt-jax sweep  --config configs/X.py --out DIR --space optim.lr=log:1e-4..3e-2 [--space ...]
                     [--set key=value ...] [--trials N] [--workers K] [--pruner median] ...
                     (an Optuna study; its own flags: minigpt-jax sweep --help)
  minigpt-jax compare --config configs/X.py --out DIR --seeds 5 --arm NAME:key=value[,key=value]
                     [--arm ...] [--baseline NAME] [--set key=value ...] [--workers K]
                     [--metric final_val_loss|best_val_loss|time_to_target --target LOSS]
  minigpt-jax compare --from_sweep SWEEP_OUT --baseline configs/X.py --out DIR --seeds 5
                     (arms over paired seeds: verdicts with paired tests, report-METRIC.md,
                      results-METRIC.csv; its own flags: minigpt-jax compare --help)
  minigpt-jax lab    [--port 7860] [--open] [--lang en|es]      (needs the `lab` extra)

`sweep`, `compare` and `lab` live outside the library, in minigpt_apps/: they are the entry
points of the group `minigpt_jax.commands` (pyproject.toml), each a `main(argv) -> exit status`
with its own flags; a package of yours adds a command the same way.

`train` keeps JAX's compilation cache in ~/.cache/minigpt_jax/jax_compilation
(MINIGPT_JAX_COMPILATION_CACHE=DIR moves it, =off turns it off).

Every key that picks a part (optim.name, model.attention_mask, loss.terms, ...) also takes
`module:attr`, code of your own importable from the working directory (docs/extending/index.md).
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import importlib
import os
import re
import signal
import sys
from importlib import metadata
from typing import TYPE_CHECKING

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from minigpt_jax.sampling.options import SampleSettings

if TYPE_CHECKING:  # the command imports it when it runs (start-up time)
    from minigpt_jax.train.loop import RunSummary

BUILT_IN = ("train", "prepare", "sample", "export", "eval", "settings")
APP_COMMANDS = "minigpt_jax.commands"  # the entry-point group of other packages' commands


def app_commands() -> dict[str, metadata.EntryPoint]:
    """The commands installed packages add (minigpt_apps: lab, sweep, compare), by name: the
    entry points of the group APP_COMMANDS, each naming a `main(argv: list[str]) -> int`."""
    return {e.name: e for e in metadata.entry_points(group=APP_COMMANDS) if e.name not in BUILT_IN}


def commands() -> tuple[str, ...]:
    """Every command: the built-in ones, then the installed packages' by name."""
    return BUILT_IN + tuple(sorted(app_commands()))


_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, e.g. configs/default.py.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, tokenizer.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
_ALLOW_RESUME_CHANGES = flags.DEFINE_bool(
    "allow_resume_changes",
    False,
    "train: resume even though seed, batch_size, data or optim differ from the checkpoint's.",
)
_TRACEBACK = flags.DEFINE_bool(
    "traceback",
    False,
    "print the whole traceback of an error (also: env MINIGPT_JAX_TRACEBACK=1); by default an "
    "error in user code shows its config key and the user's own frames only.",
)
_PROMPT = flags.DEFINE_string("prompt", "\n", "sample: text to continue.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 500, "sample: tokens to generate.")
_TEMPERATURE = flags.DEFINE_float(
    "temperature",
    SampleSettings.temperature,
    "sample: softmax temperature; the default 1.0 draws from the model's own distribution, "
    "lower sharpens it (e.g. 0.8, nanoGPT's), 0 = greedy.",
)
_TOP_K = flags.DEFINE_integer(
    "top_k", SampleSettings.top_k, "sample: keep only the k most likely tokens."
)
_TOP_P = flags.DEFINE_float(
    "top_p", SampleSettings.top_p, "sample: keep the smallest set with mass >= p."
)
_SEED = flags.DEFINE_integer("seed", 0, "sample: random seed.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "sample: independent samples to print.")
_SAMPLES_PER_BATCH = flags.DEFINE_integer(
    "samples_per_batch",
    SampleSettings.batch_size,
    "sample: samples decoded together (default: as many as fit in half the free memory).",
)
_CHECKPOINT = flags.DEFINE_enum(
    "checkpoint", "latest", ["latest", "best"], "sample, export, eval: which checkpoint of a run."
)
_PRETRAINED = flags.DEFINE_string(
    "pretrained", None, "sample, eval: a Hugging Face GPT-2 directory instead of --workdir."
)
_OUT = flags.DEFINE_string("out", None, "export: the Hugging Face GPT-2 directory to write.")
_TEXT = flags.DEFINE_string("text", None, "eval: a UTF-8 text file to measure perplexity on.")
_STRIDE = flags.DEFINE_integer(
    "stride", None, "eval: tokens between sliding windows (default: the model's block_size)."
)


def _train() -> None:
    from minigpt_jax.runtime import compile_cache
    from minigpt_jax.runtime.signals import raising_while_starting
    from minigpt_jax.sharding import exit_when_a_process_is_lost, initialize_distributed
    from minigpt_jax.train.loop import train_and_evaluate
    from minigpt_jax.typed_config import build_experiment

    if _CONFIG.value is None:
        raise app.UsageError("train needs --config, e.g. --config configs/default.py.")
    compile_cache.enable()
    initialize_distributed()  # multi-host runs only: see minigpt_jax/sharding.py
    with raising_while_starting("importing the config's plug-ins and checking it"):
        experiment = build_experiment(_CONFIG.value)  # complete, checked and typed, once
    with exit_when_a_process_is_lost(_WORKDIR.value):
        summary = train_and_evaluate(
            experiment,
            _WORKDIR.value,
            progress=_PROGRESS.value,
            allow_resume_changes=_ALLOW_RESUME_CHANGES.value,
        )
    if not summary.before_training:  # a run stopped in its setup said so in one line
        print(_summary_line(summary))
    if summary.interrupted_by:
        # 128 + the signal, as a shell reports it: a scheduler tells a preempted run apart.
        _exit_stopped(128 + signal.Signals[summary.interrupted_by].value)


def _summary_line(summary: RunSummary) -> str:
    """The line `train` ends with: the losses, the times, where it resumed and what stopped it."""
    fmt = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
    return (
        f"step {summary.step}: train loss {fmt(summary.eval_train_loss)}, "
        f"val loss {fmt(summary.val_loss)} (best {fmt(summary.best_val_loss)}); "
        f"wall {summary.wall_time_s:.1f} s, compile {summary.compile_time_s:.1f} s, "
        f"median {fmt(summary.median_step_ms)} ms/step"
        + (f"; resumed from step {summary.resumed_from}" if summary.resumed_from else "")
        + (f"; stopped by {summary.interrupted_by}" if summary.interrupted_by else "")
    )


def _prepare() -> None:
    from minigpt_jax.data.shards.read import sharded_dataset
    from minigpt_jax.typed_config import build_experiment

    if _CONFIG.value is None:
        raise app.UsageError("prepare needs --config, e.g. --config configs/gpt2_small.py.")
    config = build_experiment(_CONFIG.value)
    if config.data.format != "shards":
        # Shards that `train` would not read (it encodes a memory corpus itself) are only cost.
        raise ValueError(
            f"prepare writes token shards, which only data.format='shards' reads, but this "
            f"config's data.format is {config.data.format!r}; add --config.data.format=shards "
            "here and to `train`, or just run `train` (it encodes a memory corpus itself)."
        )
    shards_dir = config.data.shards_dir or os.path.join(_WORKDIR.value, "shards")
    kept = f"what was written is kept in {shards_dir}"
    resume = "rerun the same command to resume where it stopped"
    with _stopped_says("prepare", f"{kept}; {resume}."):
        try:
            dataset = sharded_dataset(
                config.data, config.model.block_size, _WORKDIR.value, progress=_PROGRESS.value
            )
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise OSError(
                errno.ENOSPC,
                f"no space left on the device of {shards_dir} while writing its shards; "
                f"{kept}: free some space, then {resume} (the last batch is encoded again)",
            ) from None
    print(
        f"{len(dataset.train) + len(dataset.val):,} tokens ({len(dataset.train):,} train, "
        f"{len(dataset.val):,} val), {dataset.tokenizer.kind} tokenizer with "
        f"{dataset.tokenizer.vocab_size:,} ids (end-of-text {dataset.tokenizer.eot_id})"
    )


def _sample() -> None:
    from minigpt_jax.sampling.command import print_samples

    settings = SampleSettings(
        temperature=_TEMPERATURE.value,
        top_k=_TOP_K.value,
        top_p=_TOP_P.value,
        batch_size=_SAMPLES_PER_BATCH.value,
    )
    status = print_samples(
        workdir=_WORKDIR.value,
        pretrained=_PRETRAINED.value,
        checkpoint=_CHECKPOINT.value,
        prompt=_PROMPT.value,
        max_new_tokens=_MAX_NEW_TOKENS.value,
        seed=_SEED.value,
        num_samples=_NUM_SAMPLES.value,
        settings=settings,
    )
    sys.exit(status)


def _export() -> None:
    from minigpt_jax.model_files import export_run

    if _OUT.value is None:
        raise app.UsageError("export needs --out, the directory to write, e.g. --out hf/run.")
    with _stopped_says("export", f"nothing was written to {_OUT.value}; rerun the same command."):
        out = export_run(_WORKDIR.value, _OUT.value, _CHECKPOINT.value)
    print(f"wrote {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")


def _eval() -> None:
    from minigpt_jax.train.evaluation import perplexity_of

    if _TEXT.value is None:
        raise app.UsageError("eval needs --text, a UTF-8 text file, e.g. --text valid.txt.")
    with _stopped_says("eval", "nothing was measured or written; rerun the same command."):
        result = perplexity_of(
            _PRETRAINED.value or _WORKDIR.value,
            _TEXT.value,
            stride=_STRIDE.value,
            checkpoint=_CHECKPOINT.value,
        )
    print(result.summary())


@contextlib.contextmanager
def _stopped_says(command: str, what_now: str):
    """SIGINT/SIGTERM end `command` with one line (`what_now`: what was done, how to go on)
    and the shell's status for the signal (130, 143), not a traceback."""
    from minigpt_jax.runtime.signals import Interrupted, RaiseOnSignal

    try:
        with RaiseOnSignal():
            yield
    except Interrupted as stop:
        print(
            f"minigpt-jax {command}: stopped by {stop.signal_name}; {what_now}",
            file=sys.stderr,
            flush=True,
        )
        _exit_stopped(stop.exit_status)


def _exit_stopped(status: int) -> None:
    """Ends a command that a signal stopped, once its work is closed (checkpoints saved and
    their managers closed, files flushed): the output flushed, then at once, without the
    interpreter's teardown, which a signal can catch with native threads (XLA's, tensorstore's)
    still tied to half-finished Python state."""
    jax = sys.modules.get("jax")
    if jax is not None and jax.distributed.is_initialized():
        jax.distributed.shutdown()  # what the teardown would have done for the other hosts
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _settings() -> None:
    from minigpt_jax.config_dict import settings_table

    # With --config (and overrides): that config's resolved values and its entries' settings.
    with _stopped_says("settings", "nothing was written."):
        table = settings_table(_CONFIG.value)
        if _CONFIG.value is not None:
            _check_user_entries(_CONFIG.value)
    print(table)


def _check_user_entries(config: ml_collections.ConfigDict) -> None:
    """Loads every `module:attr` the config picks, so `settings` never lists one that cannot be
    loaded (a RegistryError naming the key and why: one line)."""
    from minigpt_jax.settings.registry import REGISTRIES, is_user_key

    for key, registry in REGISTRIES.items():
        node = config
        for part in key.split("."):
            node = node.get(part) if hasattr(node, "get") else None
        if isinstance(node, str) and is_user_key(node) and "," not in node:
            registry.check(node)


def _run(argv: list[str]) -> None:
    """Runs the built-in command `argv` names; an error of ours ends it in one line."""
    try:
        command = _checked_command(argv)
    except app.UsageError as error:
        _usage_error("minigpt-jax", error)
    run = {
        "train": _train,
        "prepare": _prepare,
        "sample": _sample,
        "export": _export,
        "eval": _eval,
        "settings": _settings,
    }
    try:
        run[command]()
        _answer_late_signal(command)
    except app.UsageError as error:
        _usage_error(f"minigpt-jax {command}", error)
    except Exception as error:
        _exit_in_one_line(command, error)
        raise  # not ours: its traceback says where


def _usage_error(prog: str, error: app.UsageError) -> None:
    """A usage error in one line on stderr (absl's own handler opens with a blank line and
    the module's docstring or `USAGE: minigpt-jax [flags]`)."""
    print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
    sys.exit(error.exitcode)


def _checked_command(argv: list[str]) -> str:
    """The one built-in command `argv` names, with the flags it needs (a UsageError if not)."""
    named = [a for a in argv[1:] if not a.startswith("-")]
    if len(named) != 1 or named[0] not in commands():
        raise app.UsageError(f"name one command: {' | '.join(commands())}; got {named or 'none'}.")
    command = named[0]
    if command not in BUILT_IN:  # main() hands them to their own parsers
        raise app.UsageError(
            f"put `{command}` first, e.g. minigpt-jax {command} --config ... --out ..."
        )
    if command in ("sample", "eval") and _PRETRAINED.value is not None:
        if _WORKDIR.value is not None:
            raise app.UsageError(f"{command}: give --workdir or --pretrained, not both.")
    elif _WORKDIR.value is None and command != "settings":
        raise app.UsageError("--workdir is required, e.g. --workdir runs/default.")
    if _WORKDIR.value is not None and not _WORKDIR.value.strip():
        raise app.UsageError("--workdir is empty: name a run directory, e.g. --workdir runs/x.")
    if _WORKDIR.value is not None:
        _check_workdir_path(_WORKDIR.value)
    return command


def _exit_in_one_line(command: str, error: Exception) -> None:
    """Ends `command` with one line for a plug-in's error or one of ours; returns for any other
    error (jax's, flax's, orbax's, an unexpected kind), which is raised with its traceback."""
    _exit_on_plugin_error(command, error)
    if not isinstance(error, (ValueError, TypeError, OSError, FloatingPointError, RuntimeError)):
        return
    # Errors of ours already say what is wrong and how to fix it; a traceback adds nothing.
    if type(error).__module__.startswith(("jax", "flax", "orbax")):
        return
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        if "rerun" in str(error):
            error = error.strerror or error  # ours: the message without "[Errno 28]"
        else:
            where = f" ({error.filename})" if error.filename else ""
            error = (
                f"no space left on the device{where}; free some space, then rerun the same "
                "command (a run resumes from its last checkpoint, if it saved one)"
            )
        # orbax's writer threads, left with nowhere to write, print tracebacks at exit.
        print(f"minigpt-jax {command}: error: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    sys.exit(f"minigpt-jax {command}: error: {error}")


def _answer_late_signal(command: str) -> None:
    """A SIGINT/SIGTERM recorded once the command's work was done (every built-in command
    takes them over from its start: runtime.signals.StopRequest) still gives the signal's exit
    status; later ones stay recorded, not raised in the interpreter's teardown."""
    from minigpt_jax.runtime.signals import recorded_signal

    late = recorded_signal()
    if late is not None:
        print(
            f"minigpt-jax {command}: stopped by {late.name} after it was done.",
            file=sys.stderr,
            flush=True,
        )
        _exit_stopped(128 + int(late))


class _EntrySettingsParser(ConfigFileFlagParser):
    """Loads the --config file as ml_collections does, then adds the settings that the entries
    it picks declare (the command line's picks included), so `--config.<group>.<name>=` finds
    an entry's own setting."""

    overrides: dict[str, str] = {}

    def parse(self, path):
        from minigpt_jax.runtime.signals import raising_while_starting

        with raising_while_starting("reading the config file"):
            config = super().parse(path)
        if isinstance(config, ml_collections.ConfigDict):
            from minigpt_jax.config_dict import add_entry_settings

            with raising_while_starting("importing the config's plug-ins"):
                add_entry_settings(config, self.overrides)
        return config


def _overrides(argv: list[str]) -> dict[str, str]:
    """{dotted key: text} of the --config.<key>=<value> (or --config.<key> <value>) flags."""
    found = {}
    for i, arg in enumerate(argv):
        match = re.match(r"--config\.([\w.]+)(?:=(.*))?$", arg, re.DOTALL)
        if match:
            value = match.group(2)
            if value is None and i + 1 < len(argv):
                value = argv[i + 1]
            found[match.group(1)] = value
    return found


def _full_tracebacks() -> bool:
    return _TRACEBACK.value or os.environ.get("MINIGPT_JAX_TRACEBACK", "") not in ("", "0")


def _exit_on_plugin_error(command: str, error: Exception) -> None:
    """An error raised in user code (a `module:attr` entry): exits with one header line naming
    its config key and `module:attr`, then the user's own frames; --traceback: re-raises."""
    from minigpt_jax.settings.registry import PluginError, plugin_error

    plugin = error if isinstance(error, PluginError) else plugin_error(error)
    if plugin is None:
        return
    if _full_tracebacks():
        raise error
    print(f"minigpt-jax {command}: {plugin}", file=sys.stderr, flush=True)
    sys.exit(1)


def _check_workdir_path(workdir: str) -> None:
    """Refuses a --workdir that is, or lies inside, a file (mkdir would say `File exists`)."""
    path = os.path.abspath(workdir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if os.path.exists(path) and not os.path.isdir(path):
        where = "names" if path == os.path.abspath(workdir) else f"lies inside {path},"
        raise app.UsageError(
            f"--workdir {workdir} {where} a file, not a directory: give a run directory, "
            "e.g. --workdir runs/x."
        )


# `minigpt-jax --help`: one line per command (the module docstring has their flags).
BUILT_IN_HELP = {
    "train": "train a model (resumes from the run's last checkpoint)",
    "prepare": "write the token shards of config.data (data.format=shards)",
    "sample": "print text a run (or a Hugging Face GPT-2 directory) continues",
    "eval": "perplexity and bits per byte of a model on a text file",
    "export": "write a run as a Hugging Face GPT-2 directory",
    "settings": "every config key: default, kind and doc",
}


def _app_help(entry: metadata.EntryPoint) -> str:
    """An installed command's line: the HELP of the module its entry point names."""
    try:
        return importlib.import_module(entry.module).HELP
    except ImportError as error:
        return f"(cannot be loaded: {error})"


def _help() -> str:
    apps = app_commands()
    helps = {**BUILT_IN_HELP, **{name: _app_help(entry) for name, entry in apps.items()}}
    width = max(len(c) for c in helps)
    lines = [f"  {c:<{width}}  {helps[c]}" for c in commands()]
    return (
        "usage: minigpt-jax COMMAND [--flag=value ...]\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n"
        + (__doc__ or "").strip()
        + "\n\nEvery flag with its doc: minigpt-jax --helpfull"
    )


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parser, with a config-key typo turned into a message listing the valid keys, and
    a built-in config's name (`--config tiny`) turned into its packaged file."""
    if any(arg in ("--help", "-h", "-?", "--helpshort") for arg in argv[1:]):
        named = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
        if named is not None and named not in commands():  # `minigpt-jax nosuch --help`
            print(
                f"minigpt-jax: error: unknown command {named!r}; the commands: "
                f"{', '.join(commands())} (minigpt-jax --help says what each does).",
                file=sys.stderr,
            )
            sys.exit(2)
        print(_help())
        sys.exit(0)
    _EntrySettingsParser.overrides = _overrides(argv)
    flags.FLAGS["config"].parser = _EntrySettingsParser("config", lock_config=True)
    config_path = _config_path(argv)
    if config_path:
        from minigpt_jax.config_dict import (
            add_config_root_to_path,
            config_file_of,
            config_file_problem,
        )

        argv = _with_config_path(argv, config_file_of(config_path))
        config_path = _config_path(argv)

        add_config_root_to_path(config_path.split(":")[0])
        problem = config_file_problem(config_path)
        if problem:
            sys.exit(f"minigpt-jax: error: {problem}")
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as error:
        from minigpt_jax.config_dict import unknown_key_message

        for arg in argv:
            match = re.match(r"--config\.([\w.]+)", arg)
            if match and _key_missing(argv, match.group(1)):
                path, _, key = match.group(1).rpartition(".")
                problem = _unknown_group(match.group(1)) or unknown_key_message(path, key)
                sys.exit(f"minigpt-jax: error: {problem}")
        raise error
    except flags.Error as error:
        sys.exit(f"minigpt-jax: error: {error}\nRun `minigpt-jax --help` for the flags.")


def _unknown_group(dotted: str) -> str | None:
    """The message for a key `group.name` whose group does not exist (a typo of the group),
    suggesting the group that has `name`; None when the group exists."""
    from minigpt_jax.config_dict import EXPERIMENT_KEYS

    group, _, name = dotted.partition(".")
    groups = [g for g in EXPERIMENT_KEYS if g]
    if not name or group in EXPERIMENT_KEYS:
        return None
    holding = [g for g in groups if name.split(".")[0] in EXPERIMENT_KEYS[g]]
    close = difflib.get_close_matches(group, holding or groups, n=1, cutoff=0.5)
    return (
        f"unknown config group config.{group} (in --config.{dotted})"
        + (f": did you mean config.{close[0]}.{name}?" if close else ".")
        + f" The groups are {', '.join(groups)}."
    )


def _key_missing(argv: list[str], dotted: str) -> bool:
    """Whether `dotted` names no key of the --config file's get_config()."""
    from minigpt_jax.config_dict import load_config_file

    path = _config_path(argv)
    if path is None:
        return True
    node = load_config_file(path.split(":")[0])
    for part in dotted.split("."):
        if not hasattr(node, "keys") or part not in node:
            return True
        node = node[part]
    return False


def _with_config_path(argv: list[str], spec: str) -> list[str]:
    """argv with the --config value replaced by `spec`."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            argv[i] = f"--config={spec}"
            break
        if arg == "--config" and i + 1 < len(argv):
            argv[i + 1] = spec
            break
    return argv


def _config_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def main() -> None:
    named = [a for a in sys.argv[1:] if not a.startswith("-")]
    apps = app_commands()
    if named[:1] and named[0] in apps:  # its own flags (argparse), not absl's
        index = sys.argv.index(named[0])
        sys.exit(apps[named[0]].load()(sys.argv[1:index] + sys.argv[index + 1 :]))
    from minigpt_jax.runtime.signals import StoppedWhileStarting, record_signals_while_starting

    record_signals_while_starting()  # until the command's own stop handling takes them over
    logging.set_verbosity(logging.WARNING)  # absl INFO lines (e.g. "no TPU found") are noise here
    try:
        app.run(_run, flags_parser=_parse_flags)
    except StoppedWhileStarting as stop:  # a config file or plug-in module that did not return
        command = named[0] if named else "minigpt-jax"
        print(
            f"{stop.signal_name} received while {stop.what}, before {command} began: nothing "
            "was written; rerun the same command.",
            file=sys.stderr,
            flush=True,
        )
        _exit_stopped(stop.exit_status)


if __name__ == "__main__":
    main()
