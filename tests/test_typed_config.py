"""The typed experiment built once at the edge (minigpt_jax.typed_config): the values a config
file's ConfigDict holds, in typed groups, frozen; what a checkpoint records is unchanged."""

import dataclasses

import pytest

from minigpt_jax.config_dict import (
    check_experiment_config,
    config_file_of,
    default_config,
    load_config_file,
    packaged_config_names,
)
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.positions import RopeOptions
from minigpt_jax.optimizer_wrappers import EMA
from minigpt_jax.settings import groups, options_of
from minigpt_jax.train.hooks import SamplesOptions
from minigpt_jax.typed_config import Experiment, build_experiment


@pytest.mark.parametrize("name", packaged_config_names())
def test_a_built_in_config_types_to_the_values_its_configdict_holds(name):
    config = load_config_file(config_file_of(name))
    experiment = build_experiment(config)
    # What checkpoints record (meta["config"]) and resume compares: the same dict as before.
    assert experiment.to_dict() == check_experiment_config(config).to_dict()
    assert isinstance(experiment.model, GPTConfig)
    for group, cls in groups.GROUPS.items():
        assert type(getattr(experiment, group)) is cls
    assert experiment.model.block_size == config.model.block_size
    assert experiment.optim.lr == config.optim.lr
    assert experiment.micro_batch_size == config.batch_size // config.get("grad_accum_steps", 1)


def test_entry_owned_settings_join_their_group_and_reach_the_entry_as_options():
    config = default_config()
    config.hooks.names = "samples"  # declares sample_every, sample_prompt, sample_tokens
    config.hooks.sample_every = 7
    config.model.pos_encoding = "rope"  # declares rope_theta
    experiment = build_experiment(config)
    assert options_of(experiment.hooks, SamplesOptions) == SamplesOptions(sample_every=7)
    # The group's settings by name, the picked entries' own too, as one explicit mapping.
    values = experiment.hooks.flat_values()
    assert values["sample_tokens"] == 64 and values["names"] == "samples"
    assert experiment.hooks.entry_settings == (
        ("sample_every", 7),
        ("sample_prompt", "\n"),
        ("sample_tokens", 64),
    )
    assert options_of(experiment.model, RopeOptions) == RopeOptions(rope_theta=10000.0)
    assert "beta3" not in experiment.optim.flat_values()
    # A typed group is no dict: its settings are attributes, options_of or flat_values.
    with pytest.raises(TypeError):
        experiment.hooks["sample_tokens"]  # noqa: B018
    with pytest.raises(TypeError):
        "names" in experiment.hooks  # noqa: B015
    assert experiment.to_dict()["hooks"] == {
        "names": "samples",
        "sample_every": 7,
        "sample_prompt": "\n",
        "sample_tokens": 64,
    }
    with pytest.raises(LookupError, match=r"Optim holds no EmaOptions: its config does not pick"):
        options_of(experiment.optim, EMA)  # eval_params=auto: the ema entry is not picked
    with pytest.raises(AttributeError, match=r"options_of\(hooks, entry\)\.sample_every"):
        getattr(experiment.hooks, "sample_every")  # noqa: B009 (an entry's setting is no attribute)


def test_the_experiment_is_frozen_and_built_once():
    experiment = build_experiment(default_config())
    assert build_experiment(experiment) is experiment
    with pytest.raises(dataclasses.FrozenInstanceError):
        experiment.batch_size = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        experiment.optim.lr = 1.0
    hash(experiment.model)  # what jit sees as a static argument


def test_training_takes_the_typed_experiment_only(tmp_path):
    """A ConfigDict handed to train_and_evaluate is refused, naming what builds the experiment;
    nothing is written."""
    from minigpt_jax.train.loop import train_and_evaluate

    with pytest.raises(TypeError, match=r"takes the typed experiment, got ConfigDict: .*"
                       r"build_experiment\(config\)"):  # fmt: skip
        train_and_evaluate(default_config(), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_bad_value_is_refused_at_the_edge_naming_the_key():
    config = default_config()
    config.optim.lr = -1.0
    with pytest.raises(ValueError, match=r"config\.optim\.lr"):
        build_experiment(config)


def test_the_group_classes_are_the_declarations_the_config_keys_come_from():
    """Every field of Experiment but the groups is a loop setting, and each group's type is the
    dataclass whose declarations give that group's keys: one declaration, one type."""
    loop_names = set(groups.declarations(groups.Loop))
    names = {f.name for f in dataclasses.fields(Experiment)} - {"entry_settings"}
    assert names == loop_names | {"model", *groups.GROUPS}
