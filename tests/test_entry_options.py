"""Every entry sees its own settings as a typed options object: `declares` on a flax module
class, RoPE's base as the built-in rope's own setting (`RopeOptions.rope_theta`), a user rotary
entry reading a setting of its own, the options made once when the config is built (checked by
their rules), and `GPTConfig.replace` setting an entry's setting as it does a field."""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.config_dict import default_config
from minigpt_jax.model.positions import POSITION_ENCODINGS, RopeOptions
from minigpt_jax.optimizer_wrappers import EMA, EmaOptions
from minigpt_jax.settings import MODEL, declares, options_of, setting
from minigpt_jax.settings.registry import declared_settings

CFG = GPTConfig(vocab_size=40, block_size=12, n_layer=1, n_head=2, n_embd=16, dropout=0.0)
TOKENS_BxT = jax.random.randint(jax.random.key(3), (2, 9), 0, CFG.vocab_size)

WIDE_MLP = """
import flax.linen as nn

from minigpt_jax.model.param_meta import declare
from minigpt_jax.settings import MODEL, declares, options_of, setting


@declares(widen=setting(2, "hidden width = widen x D", MODEL, low=1))
class Wide(nn.Module):
    cfg: object

    @nn.compact
    def __call__(self, x_BxTxD, *, deterministic=True):
        init = declare(nn.initializers.normal(0.02), muon=(0, 1), decay=True)
        widen = options_of(self.cfg, Wide).widen
        h_BxTxF = nn.relu(nn.Dense(widen * self.cfg.n_embd, kernel_init=init)(x_BxTxD))
        return nn.Dense(self.cfg.n_embd, kernel_init=init)(h_BxTxF)
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_wide_mlp.py").write_text(WIDE_MLP)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_wide_mlp", None)


def numpy_rope(x_BxTxHxK, positions_T, theta):
    """RoFormer's rotation of pairs (2i, 2i+1) by pos / theta^(2i/K), in float64 numpy."""
    x = np.asarray(x_BxTxHxK, np.float64)
    k = x.shape[-1]
    angles_TxR = positions_T[:, None] / theta ** (np.arange(0, k, 2) / k)
    cos, sin = np.cos(angles_TxR)[None, :, None], np.sin(angles_TxR)[None, :, None]
    even, odd = x[..., 0::2], x[..., 1::2]
    return np.stack([even * cos - odd * sin, even * sin + odd * cos], -1).reshape(x.shape)


def test_declares_works_on_a_flax_module_class(user_module):
    import my_wide_mlp

    assert set(declared_settings(my_wide_mlp.Wide)) == {"widen"}
    cfg = CFG.replace(mlp="my_wide_mlp:Wide")
    assert options_of(cfg, my_wide_mlp.Wide) == my_wide_mlp.Wide.options_class(widen=2)
    kernel = init_params(cfg.replace(widen=3), jax.random.key(0))["block_0"]["mlp"]["Dense_0"]
    assert kernel["kernel"].shape == (16, 48)


def test_rope_theta_is_the_builtin_ropes_own_setting():
    cfg = CFG.replace(pos_encoding="rope")
    assert options_of(cfg, RopeOptions) == RopeOptions(rope_theta=10000.0)
    rotary = POSITION_ENCODINGS["rope"].rotary
    x_BxTxHxK = jax.random.normal(jax.random.key(1), (1, 9, 2, 8))
    positions_BxT = jnp.arange(9)[None] * 7
    for theta in (10000.0, 500000.0):
        got = rotary(x_BxTxHxK, positions_BxT, cfg.replace(rope_theta=theta))
        np.testing.assert_allclose(got, numpy_rope(x_BxTxHxK, np.arange(9) * 7, theta), atol=2e-5)
    params = init_params(cfg, jax.random.key(0))
    default = forward(params, TOKENS_BxT, cfg)
    np.testing.assert_array_equal(forward(params, TOKENS_BxT, cfg.replace(rope_theta=1e4)), default)
    assert not np.allclose(forward(params, TOKENS_BxT, cfg.replace(rope_theta=5e5)), default)


def test_replace_checks_an_entry_setting_and_names_the_known_ones():
    cfg = CFG.replace(pos_encoding="rope")
    assert cfg.replace(rope_theta=5e5).entry_settings == (("rope_theta", 5e5),)
    with pytest.raises(ValueError, match=r"GPTConfig.rope_theta must be a finite number > 1"):
        cfg.replace(rope_theta=0.5)
    with pytest.raises(TypeError, match=r"'window' is neither a field nor a setting .*rope_theta"):
        cfg.replace(window=4)
    with pytest.raises(LookupError, match="GPTConfig holds no RopeOptions: its config does not"):
        options_of(CFG, RopeOptions)  # learned positions declare no base
    with pytest.raises(AttributeError, match=r"options_of\(cfg, entry\)\.rope_theta"):
        getattr(cfg, "rope_theta")  # noqa: B009 (an entry's setting is no attribute)


def test_the_options_are_made_once_when_the_config_is_and_checked_there():
    cfg = CFG.replace(pos_encoding="rope", rope_theta=5e5)
    made = options_of(cfg, RopeOptions)
    assert made == RopeOptions(rope_theta=5e5)
    assert options_of(cfg, POSITION_ENCODINGS["rope"]) is made  # by the entry, or its class
    with pytest.raises(ValueError, match=r"GPTConfig.rope_theta must be a finite number > 1"):
        GPTConfig(vocab_size=40, pos_encoding="rope", entry_settings=(("rope_theta", 0.5),))


def test_the_short_form_of_declares_makes_a_frozen_options_dataclass():
    @declares(window=setting(4, "keys each query sees", MODEL, low=1))
    @declares(stride=setting(1, "positions between keys", MODEL, low=1))
    def sliding(q_positions_BxT, k_positions_BxS, cfg):
        raise AssertionError("never called")

    options = sliding.options_class
    assert options() == options(stride=1, window=4)
    assert set(declared_settings(sliding)) == {"window", "stride"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options().window = 8


def test_declares_refuses_an_options_class_that_is_not_frozen_settings():
    @dataclasses.dataclass
    class Loose:
        window: int = setting(4, "keys each query sees", MODEL, low=1)

    @dataclasses.dataclass(frozen=True)
    class Untyped:
        window: int = 4

    for options in (Loose, Untyped):
        with pytest.raises(TypeError, match="is not a frozen dataclass whose fields are all"):
            declares(options)


def test_a_configdict_group_gives_the_options_of_its_values():
    """A script's `make_optimizer(config.optim, ...)` hands the entry a ConfigDict group."""
    config = default_config()
    config.optim.eval_params, config.optim.ema_decay = "ema", 0.5
    assert options_of(config.optim, EMA) == EmaOptions(ema_decay=0.5)
    config.optim.ema_decay = 2.0
    with pytest.raises(ValueError, match=r"config.ema_decay=2.0 is out of range"):
        options_of(config.optim, EMA)


@pytest.mark.slow
@pytest.mark.parametrize("data_format", ["memory", "shards"])
def test_a_tokenizer_entry_reads_its_own_path_setting_through_the_cli(
    tmp_path, corpus_file, data_format
):
    """docs/extending/data.md's my_tokenizers.py: its alphabet_path setting reaches the entry (the
    file's characters, absent from the corpus, are in the run's tokenizer)."""
    import subprocess

    from helpers import extending_files, train_args

    source = extending_files()["my_tokenizers.py"]
    (tmp_path / "my_tokenizers.py").write_text(source)
    (tmp_path / "alphabet.txt").write_text("\u2603\u265e")
    assert "\u2603" not in corpus_file.read_text()
    workdir = tmp_path / "run"
    args = train_args(
        workdir,
        corpus_file,
        "--config.data.tokenizer=my_tokenizers:fixed_alphabet",
        f"--config.data.alphabet_path={tmp_path / 'alphabet.txt'}",
        f"--config.data.format={data_format}",
        "--config.num_steps=2",
        "--config.eval_every=2",
        "--config.checkpoint_every=2",
    )
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    from minigpt_jax.data.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(workdir / "tokenizer.json")
    assert tokenizer.decode(tokenizer.encode("\u2603\u265e")) == "\u2603\u265e"


def test_a_config_picking_a_short_form_entry_pickles_and_rebuilds_its_options(user_module):
    """A pickle (a process pool's, a deepcopy) holds the settings; the options object of an
    entry whose class `declares` made (which pickle cannot name) is built again on load."""
    import copy
    import pickle

    from minigpt_jax.model.blocks import MLPS

    cfg = CFG.replace(mlp="my_wide_mlp:Wide").replace(widen=5)
    wide = MLPS["my_wide_mlp:Wide"]  # the class the config picked (the registry's import)
    restored = pickle.loads(pickle.dumps(cfg))
    assert restored == cfg
    assert options_of(restored, wide).widen == 5
    assert options_of(copy.deepcopy(cfg), wide).widen == 5
