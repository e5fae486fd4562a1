"""The typed experiment: what a run reads its settings from, built once at the edge.

A config file is an ml_collections ConfigDict (config_dict); `build_experiment` completes and
checks it once and turns it into a frozen `Experiment`: the loop settings at the top and one
typed group each for `model` (GPTConfig), `optim`, `data`, `mesh`, `loss`, `eval` and `hooks`
(settings.groups), each built once. Nothing below the edge takes a ConfigDict:
`train_and_evaluate` and everything it calls read this object. `to_dict()` gives the
ConfigDict's own values back (what a checkpoint records, so runs written before resume as
they did).

The model group's vocab_size is the tokenizer's, unknown until the data is read: it stands at
1 here, and the run's setup sets it (`GPTConfig.replace`) as each phase learns it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from minigpt_jax.config_dict import RunConfig, checked_config, typed_group
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.settings import groups as settings


@dataclasses.dataclass(frozen=True)
class Experiment(settings.Loop):
    """A complete, checked run config: the loop settings (settings.Loop) and its typed groups."""

    model: GPTConfig = None  # type: ignore[assignment]  (always set by build_experiment)
    optim: settings.Optim = settings.Optim()
    data: settings.Data = settings.Data()
    mesh: settings.Mesh = settings.Mesh()
    loss: settings.Loss = settings.Loss()
    eval: settings.Eval = settings.Eval()
    hooks: settings.Hooks = settings.Hooks()

    @property
    def micro_batch_size(self) -> int:
        """Rows of one micro-batch: batch_size split into grad_accum_steps (checked to divide)."""
        return self.batch_size // self.grad_accum_steps

    def to_dict(self) -> dict[str, Any]:
        """The run config's values as nested dicts, as its ConfigDict's to_dict() gives them
        (the model group without vocab_size: the tokenizer decides it)."""
        values = super().to_dict()
        values["model"] = self.model.to_dict()
        del values["model"]["vocab_size"]
        for group in settings.GROUPS:
            values[group] = getattr(self, group).to_dict()
        return values


def build_experiment(config: RunConfig | Experiment) -> Experiment:
    """The typed, checked experiment of `config` (a run config: ConfigDict or dict, completed
    and checked by config_dict.check_experiment_config, which raises ValueError naming any
    problem); an Experiment is returned as it is."""
    if isinstance(config, Experiment):
        return config
    complete, model = checked_config(config)
    groups = {group: typed_group(complete, group) for group in settings.GROUPS}
    loop = Experiment.from_values(complete.to_dict(), skip=("model", *settings.GROUPS))
    return dataclasses.replace(loop, model=model, **groups)
