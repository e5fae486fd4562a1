"""One declaration per setting: the key lists, range checks, resume rules and export rules all
derive from it, and they say what they said before the declarations existed."""

import dataclasses
import math
import re

import pytest

from configs import default, gpt2_small, shakespeare_char, tiny
from minigpt_jax import GPTConfig
from minigpt_jax.config_dict import (
    EXPERIMENT_KEYS,
    check_experiment_config,
    complete,
    declaration,
    default_config,
    settings_table,
)
from minigpt_jax.gpt2 import check_exportable
from minigpt_jax.model_files import shape_mismatch
from minigpt_jax.settings.groups import GROUPS, KINDS, Loop, declarations
from minigpt_jax.settings.registry import REGISTRIES
from minigpt_jax.train.resume import SPEED_FIELDS, check_resume


def test_every_key_has_one_declaration_with_a_doc_and_a_kind():
    for group, keys in EXPERIMENT_KEYS.items():
        for key in keys:
            if key in GROUPS or key == "model":
                continue
            spec = declaration(f"{group}.{key}" if group else key)
            assert spec is not None and spec.doc and spec.kind in KINDS, (group, key)


def test_data_docs_name_every_built_in_entry_of_their_registry():
    """The names of the data group's choices live in their registries (settings import no
    data module); a setting's doc that lists them is checked against them."""
    for config_key in ("data.corpus", "data.file_format", "data.tokenizer", "data.format"):
        doc = declaration(config_key).doc
        for name in REGISTRIES[config_key].names():
            assert re.search(rf"\b{name}\b", doc), (config_key, name, doc)


def test_default_config_is_every_declared_default():
    config = default_config()
    assert config.seed == 0 and config.optim.lr == 1e-3 and config.data.path is None
    assert dict(config.model) == {
        f.name: f.default
        for f in dataclasses.fields(GPTConfig)
        if f.name != "vocab_size" and "setting" in f.metadata  # not entry_settings
    }
    assert set(config) == set(EXPERIMENT_KEYS[""])
    assert set(settings_table().split()) >= {"lr", "attention_mask", "terms", "trajectory"}


def test_minigpt_jax_settings_lists_each_registry_keys_built_in_entries(tmp_path):
    """Issue 52: `minigpt-jax settings` named `attention_fns.ATTENTION_MASKS` without its entries;
    now each key that picks a registry entry lists the built-in ones on its row."""
    from helpers import cli_in

    out = cli_in(tmp_path, "settings").stdout
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert rows["attention_mask"].endswith("[built-in: causal | document]")
    assert rows["terms"].endswith("[built-in: z_loss | activation_l2]")
    assert rows["gradient"].endswith("[built-in: plain]")
    for config_key, registry in REGISTRIES.items():
        listed = re.search(r"\[built-in: (.*)\]$", rows[config_key.rpartition(".")[2]])
        assert listed and listed.group(1).split(" | ") == registry.names(), config_key


def test_speed_fields_and_finetune_rules_are_what_they_were():
    """The lists resume.py and pretrained.py spelled out before, now derived."""
    assert set(SPEED_FIELDS) == {
        "dense_grad", "norm_grad", "matmul_dtype", "attention", "loss_chunk", "remat",
    }  # fmt: skip
    loaded = GPTConfig()
    wanted = GPTConfig(
        dropout=0.0,
        dtype="bfloat16",
        param_dtype="bfloat16",
        dense_grad="direct",
        norm_grad="direct",
        matmul_dtype="bfloat16",
        attention="explicit",
        loss_chunk=64,
        remat="full",
        vocab_multiple=64,
        block_size=32,
    )
    assert shape_mismatch(loaded, wanted) == []
    assert shape_mismatch(loaded, wanted.replace(n_layer=2)) == ["n_layer: checkpoint 4, config 2"]


def test_export_rules_name_each_setting_gpt2_lacks():
    check_exportable(GPTConfig())
    for changes, words in (
        (dict(pos_encoding="rope"), "pos_encoding='rope' (GPT-2 has 'learned')"),
        (dict(embed_scale=2.0), "embed_scale=2.0 (GPT-2 has 1.0)"),
        (dict(causal=False), "causal=False (GPT-2 has True)"),
        (dict(norm="rmsnorm"), "norm='rmsnorm' (GPT-2 has 'layernorm')"),
        (dict(activation="relu2"), "activation='relu2' (GPT-2 has 'gelu')"),
    ):
        with pytest.raises(ValueError, match=r"no GPT-2 form") as error:
            check_exportable(GPTConfig(**changes))
        assert words in str(error.value)


def test_trajectory_settings_are_refused_on_resume_and_others_are_free():
    saved = {"gpt_config": dataclasses.asdict(GPTConfig()), "config": default_config().to_dict()}
    changed = default_config()
    changed.num_steps, changed.steps_per_call, changed.mesh.data = 3000, 5, 1  # free
    changed.model.attention = "explicit"
    meta = {"gpt_config": dataclasses.asdict(GPTConfig()), "config": changed.to_dict()}
    # Free, but a num_steps that reshapes the schedule is named (issue 54).
    (note,) = check_resume(saved, meta, "ckpt")
    assert note.startswith("config.num_steps: 1500 -> 3000, which reshapes the cosine"), note
    changed.optim.name, changed.loss.terms = "optax:lion", "z_loss"
    meta["config"] = changed.to_dict()
    with pytest.raises(ValueError, match=r"config.loss.terms: '' -> 'z_loss'.*optim.name"):
        check_resume(saved, meta, "ckpt")


def test_a_config_states_only_what_differs():
    """A group or key a config file leaves out takes its declared default."""
    config = complete({"num_steps": 20, "optim": {"lr": 0.01}})
    assert config.num_steps == 20 and config.optim.lr == 0.01 and config.optim.b2 == 0.99
    assert config.model.n_layer == 4 and config.loss.terms == ""
    with pytest.raises(ValueError, match=r"unknown config key config.optim.lrate"):
        complete({"optim": {"lrate": 0.01}})


@pytest.mark.parametrize(
    "dotted, value, words",
    [
        ("model.embed_scale", math.inf, "embed_scale must be a positive number (and finite)"),
        ("optim.lr", math.nan, "config.optim.lr=nan is out of range"),
        ("seed", -1, "config.seed=-1 is out of range: it must be an integer >= 0"),
        ("data.val_fraction", 0.0, "config.data.val_fraction=0.0 is out of range"),
        ("data.format", "disk", "config.data.format='disk' is not a known data format"),
        ("optim.name", "lamb", "config.optim.name='lamb' is not a known optimizer"),
        ("loss.terms", "zloss", "config.loss.terms='zloss' is not a known loss term"),
        ("model.norm", "batchnorm", "config.model.norm='batchnorm' is not a known norm"),
    ],
)
def test_values_outside_their_declaration_are_named(dotted, value, words):
    config = default_config()
    group, _, key = dotted.rpartition(".")
    (config[group] if group else config)[key] = value
    with pytest.raises(ValueError) as error:
        check_experiment_config(config)
    assert words in str(error.value)


@pytest.mark.parametrize("module", [default, tiny, shakespeare_char, gpt2_small])
def test_every_config_file_passes_its_checks(module):
    check_experiment_config(module.get_config())


def test_loop_declarations_cover_the_top_level():
    assert list(declarations(Loop)) == [k for k in EXPERIMENT_KEYS[""] if k not in GROUPS][:-1]
