"""Hooks: code of one's own that the training loop runs between compiled chunks, at steps,
evaluations and checkpoints, outside the compiled step: the registry `HOOKS`, picked by
`config.hooks.names` (comma-separated names or module:attr); settings a hook declares join the
`config.hooks` group.

An entry is a class (or any callable) taking the run's `config.hooks` group (its own settings'
options object is `options_of(group, entry)`) and returning an object with any of these
methods, each given a `HookContext` (the step, the config, the model config, the train state,
the params evaluation uses, the tokenizer, the workdir):
  on_step(ctx)                   after every `every` steps (its attribute; 0: never)
  on_evaluation(ctx, val, train) after each evaluation, with its results by name
  on_checkpoint(ctx)             after each checkpoint is saved
A method that returns True stops the run early: the loop saves a checkpoint and ends as it does
after a signal (rerunning the same command resumes). An exception in a hook is a plug-in error
naming `config.hooks.names` and the hook's own frames, raised after the trained steps are saved.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from minigpt_jax.model.gpt import forward
from minigpt_jax.settings.groups import BOOKKEEPING, options_of, setting
from minigpt_jax.settings.groups import Hooks as HooksGroup
from minigpt_jax.settings.registry import Registry, declares, plugin_error

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
    hook's `every`, read once); each call returns True when a hook asks to stop."""

    def __init__(self, config: Experiment):
        keys = [item.strip() for item in config.hooks.names.split(",") if item.strip()]
        self.hooks = [(key, HOOKS[key](config.hooks)) for key in keys]
        self._every = [_every(hook) for _, hook in self.hooks]  # 0: no on_step
        self.step_every = tuple(sorted(set(self._every) - {0}))  # on_step is due at multiples

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

    @staticmethod
    def _call(hooks: list[tuple[str, Any]], method: str, ctx: HookContext, *args: Any) -> bool:
        stop = False
        for key, hook in hooks:
            fn = getattr(hook, method, None)
            if fn is not None:
                try:
                    stop = bool(fn(ctx, *args)) or stop
                except Exception as error:  # the loop saves, then raises it as a plug-in error
                    raise HookError(key, method, error) from error
        return stop


class HookError(Exception):
    """A hook raised: `key` (config.hooks) and `method`; the cause is the hook's own error."""

    def __init__(self, key: str, method: str, error: BaseException):
        super().__init__(
            f"{type(error).__name__} in {method} of config.hooks.names={key!r}: {error}"
        )
        self.key, self.method, self.error = key, method, error


def hook_plugin_error(error: HookError, step: int) -> Exception:
    """The plug-in error for a hook that raised at `step` (its frames; the steps are saved)."""
    where = f"config.hooks.names={error.key!r} ({error.method} at step {step}, saved first)"
    return plugin_error(error.error, where=where)


def _every(hook: Any) -> int:
    return int(getattr(hook, "every", 0) or 0) if hasattr(hook, "on_step") else 0
