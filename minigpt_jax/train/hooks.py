"""Hooks: code of one's own that the training loop runs between compiled chunks, at steps,
evaluations and checkpoints, outside the compiled step: the registry `HOOKS`, picked by
`config.hooks.names` (comma-separated names or module:attr); settings a hook declares join the
`config.hooks` group.

An entry is a class (or any callable) taking the run's `config.hooks` group (its own settings'
options object is `options_of(group, entry)`) and returning an object with any of these
methods, each given a `HookContext` (the step, the config, the model config, the train state,
the params evaluation uses, the tokenizer, the workdir):
  on_start(ctx)                  once before this call's first step: check what needs the run
                                 (its tokenizer, its model); an exception refuses it untrained
  on_step(ctx)                   after every `every` steps (its attribute, a whole number;
                                 0 or none: never)
  on_evaluation(ctx, val, train) after each evaluation, with its results by name
  on_checkpoint(ctx)             after each checkpoint is saved
on_step, on_evaluation and on_checkpoint return None or False to go on, True to stop the run
early: the loop saves a checkpoint and says how to go on (anything else is refused as a
contract error). Hooks run
under a guard: an exception, sys.exit() or KeyboardInterrupt in a hook is a plug-in error
naming `config.hooks.names` and the hook's own frames, raised after the trained steps are
saved; a hook that has not returned 5 s after SIGINT/SIGTERM is stopped where it stands
(runtime.signals.TrainingStop.user_code). Only os._exit() escapes the guard: it ends the
process at once, with nothing saved since the last checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import numbers
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from minigpt_jax.model.gpt import forward
from minigpt_jax.runtime.signals import UserCodeStopped
from minigpt_jax.settings.groups import BOOKKEEPING, options_of, setting
from minigpt_jax.settings.groups import Hooks as HooksGroup
from minigpt_jax.settings.registry import (
    Registry,
    RegistryError,
    declares,
    is_user_key,
    plugin_error,
)

if TYPE_CHECKING:  # typed_config imports this module (its registry): a type-only import
    from minigpt_jax.model.config import GPTConfig
    from minigpt_jax.typed_config import Experiment

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HookContext:
    """What a hook sees: read it, do not change the state (the loop owns it)."""

    step: int
    config: Experiment
    cfg: GPTConfig  # the run's model, vocab_size set
    state: Any  # the TrainState after `step` steps
    params: Any  # the params evaluation, sampling and best/ use (optim.eval_params)
    tokenizer: Any
    workdir: Path


@dataclasses.dataclass(frozen=True)
class SamplesOptions:
    """The samples hook's own settings (`hooks.sample_every`, ...)."""

    sample_every: int = setting(100, "samples: steps between samples", BOOKKEEPING, low=1)
    sample_prompt: str = setting("\n", "samples: the prompt each sample continues", BOOKKEEPING)
    sample_tokens: int = setting(64, "samples: new tokens of each sample", BOOKKEEPING, low=1)


@declares(SamplesOptions)
class Samples:
    """Continues `sample_prompt` by `sample_tokens` greedy tokens of the eval params every
    `sample_every` steps, appends {"step", "text"} to workdir/samples.jsonl and logs the text.
    Each token is one jit-compiled forward over the last block_size tokens, right-padded to
    block_size (causal attention: the padding is invisible), so it compiles once."""

    def __init__(self, config: HooksGroup):
        options = options_of(config, SamplesOptions)
        self.every = options.sample_every
        self.prompt, self.tokens = options.sample_prompt, options.sample_tokens
        self._forward = None

    def on_start(self, ctx: HookContext) -> None:
        """Refuses, before training, a prompt the run's tokenizer cannot encode."""
        try:
            ids = ctx.tokenizer.encode(self.prompt)
        except ValueError as error:
            raise ValueError(
                f"config.hooks.sample_prompt={self.prompt!r} (the samples hook): {error}"
            ) from None
        if len(ids) == 0:
            raise ValueError(
                f"config.hooks.sample_prompt={self.prompt!r} (the samples hook) encodes to no "
                "token: give a prompt of at least one character."
            )

    def on_step(self, ctx: HookContext) -> None:
        if self._forward is None:
            self._forward = jax.jit(functools.partial(forward, cfg=ctx.cfg))
        width = ctx.cfg.block_size
        ids = [int(i) for i in ctx.tokenizer.encode(self.prompt)]
        for _ in range(self.tokens):
            window = ids[-width:]
            tokens_1xW = np.zeros((1, width), np.int32)
            tokens_1xW[0, : len(window)] = window
            logits_1xWxV = self._forward(ctx.params, tokens_1xW)
            ids.append(int(np.argmax(logits_1xWxV[0, len(window) - 1])))
        text = ctx.tokenizer.decode(ids)
        with open(ctx.workdir / "samples.jsonl", "a") as out:
            out.write(json.dumps({"step": ctx.step, "text": text}) + "\n")
        _log.info("sample at step %d: %r", ctx.step, text)


def _hook_entry(value: Any) -> Any:
    """A user's hook entry as it is: a class, or a function of one argument."""
    if isinstance(value, type) or callable(value):
        return value
    raise TypeError(f"a hook entry must be {HOOK_SHAPE}, got {type(value).__name__} {value!r}.")


HOOK_SHAPE = (
    "a class (or function) hooks_config -> object with on_step / on_evaluation / on_checkpoint"
)
HOOKS: Registry[Any] = Registry(
    "hook",
    "hooks.names",
    {"samples": Samples},
    coerce=_hook_entry,
    shape=HOOK_SHAPE,
    split=lambda spec: [item.strip() for item in spec.split(",") if item.strip()],
)


class Hooks:
    """The picked hooks of a run, made once, with the steps their on_step is called at (each
    hook's `every`, read once and checked); each call returns True when a hook asks to stop
    (`stopped_by` then names the first that did). After a hook was stopped by a signal
    (`interrupted`), no hook is called again in this run."""

    def __init__(self, config: Experiment):
        keys = [item.strip() for item in config.hooks.names.split(",") if item.strip()]
        self.hooks = [(key, HOOKS[key](config.hooks)) for key in keys]
        self._every = [_every(key, hook) for key, hook in self.hooks]  # 0: no on_step
        self.step_every = tuple(sorted(set(self._every) - {0}))  # on_step is due at multiples
        self.stopped_by: tuple[str, str] | None = None  # (key, method) of the first stop asked
        self.interrupted = False

    def start(self, ctx: HookContext) -> bool:
        """on_start of every hook: checks, never a stop request (False)."""
        self._call(self.hooks, "on_start", ctx)
        self.stopped_by = None
        return False

    def step(self, ctx: HookContext) -> bool:
        due = [
            (key, hook)
            for (key, hook), every in zip(self.hooks, self._every, strict=True)
            if every and ctx.step % every == 0
        ]
        return self._call(due, "on_step", ctx)

    def evaluation(self, ctx: HookContext, val: dict, train: dict) -> bool:
        return self._call(self.hooks, "on_evaluation", ctx, val, train)

    def checkpoint(self, ctx: HookContext) -> bool:
        return self._call(self.hooks, "on_checkpoint", ctx)

    def _call(self, hooks: list[tuple[str, Any]], method: str, ctx: HookContext, *args) -> bool:
        stop = False
        for key, hook in [] if self.interrupted else hooks:
            fn = getattr(hook, method, None)
            if fn is None:
                continue
            try:
                answer = fn(ctx, *args)
            except UserCodeStopped as stopped:  # a signal it did not return from in time
                self.interrupted = True
                raise HookStopped(key, method, stopped) from None
            # The loop saves, then raises it as a plug-in error; sys.exit() and Ctrl-C raised
            # by the hook itself too (signals are the loop's: they never raise in a hook).
            except (Exception, SystemExit, KeyboardInterrupt) as error:
                raise HookError(key, method, error) from error
            if answer is not None and not isinstance(answer, (bool, np.bool_)):
                raise HookError(key, method, None, answer=answer)
            if answer and self.stopped_by is None:
                self.stopped_by = (key, method)
            stop = bool(answer) or stop
        return stop


class HookError(Exception):
    """A hook raised (`error`, its own exception), or returned `answer`, neither None, True nor
    False: `key` (config.hooks) and `method`."""

    def __init__(self, key: str, method: str, error: BaseException | None, answer: Any = None):
        what = f"returned {answer!r}" if error is None else f"{type(error).__name__}: {error}"
        super().__init__(f"{method} of config.hooks.names={key!r} {what}")
        self.key, self.method, self.error, self.answer = key, method, error, answer


class HookStopped(Exception):
    """A hook that SIGINT/SIGTERM stopped where it stood (`key`, `method`), as it had not
    returned in time."""

    def __init__(self, key: str, method: str, stopped: UserCodeStopped):
        super().__init__(f"{method} of config.hooks.names={key!r} stopped by {stopped.signal_name}")
        self.key, self.method = key, method
        self.signal_name, self.grace_s = stopped.signal_name, stopped.grace_s


def hook_plugin_error(error: HookError, step: int, kept: str) -> Exception:
    """The error for a hook that raised or broke its contract at `step`: one line naming it,
    then its own frames; `kept` says what was saved ("saved first", "before training")."""
    where = f"config.hooks.names={error.key!r} ({error.method} at step {step}, {kept})"
    if error.error is None:
        return RegistryError(
            f"{where} returned {error.answer!r} ({type(error.answer).__name__}): a hook "
            "returns True to stop the run, False or None to go on."
        )
    if isinstance(error.error, SystemExit | KeyboardInterrupt):
        plugin = plugin_error(error.error, where=where)
        code = f"({error.error.code!r})" if isinstance(error.error, SystemExit) else ""
        plugin.header = (
            f"{where}: the hook raised {type(error.error).__name__}{code}; a hook may not end "
            "the process (return True to stop the run)"
        )
        return plugin
    if error.method == "on_start" and not is_user_key(error.key):
        return error.error  # a built-in hook's check: its own one line
    return plugin_error(error.error, where=where)


def _every(key: str, hook: Any) -> int:
    """The hook's `every` (0 without on_step), refused naming the hook unless a whole number of
    steps >= 0."""
    if not hasattr(hook, "on_step"):
        return 0
    every = getattr(hook, "every", 0)
    if every is None:
        return 0
    if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 0:
        raise ValueError(
            f"config.hooks.names={key!r}: its `every` is {every!r} ({type(every).__name__}); "
            "it must be a whole number of steps between its on_step calls (0 or none: never)."
        )
    return int(every)
