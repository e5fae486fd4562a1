"""Registries: names and `module:attr` resolve to entries; what does not resolve is named with
the entries and the fix; the built-in entries compute what their papers say."""

import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default
from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.model.layers import ACTIVATIONS, NORMS, relu_squared
from minigpt_jax.model.losses import LOSS_TERMS, parse_terms, term_name, z_loss
from minigpt_jax.registry import Registry, RegistryError
from minigpt_jax.train.optimizers import OPTIMIZERS, SCHEDULES


def test_names_and_user_attributes_resolve():
    assert OPTIMIZERS["adamw"] is OPTIMIZERS["minigpt_jax.train.optimizers:adamw"]
    assert ACTIVATIONS["jax.nn:silu"] is jax.nn.silu
    assert "adamw" in OPTIMIZERS and "no.such:thing" not in OPTIMIZERS


def test_unknown_name_lists_the_entries_and_the_user_form():
    with pytest.raises(RegistryError, match=r"optim.name='adamww'.*did you mean 'adamw'"):
        OPTIMIZERS["adamww"]
    with pytest.raises(RegistryError, match=r"the optimizers are adamw, muon, or name your own"):
        OPTIMIZERS["sgd"]


def test_unresolvable_user_code_names_the_error_and_the_fix():
    with pytest.raises(RegistryError, match=r"ModuleNotFoundError.*PYTHONPATH.*resume"):
        OPTIMIZERS["not_a_module_here:lion"]
    with pytest.raises(RegistryError, match=r"AttributeError"):
        OPTIMIZERS["optax:no_such_optimizer"]


def test_an_entry_of_the_wrong_kind_is_refused():
    with pytest.raises(RegistryError, match="must be a function"):
        OPTIMIZERS["math:pi"]
    with pytest.raises(RegistryError, match="must be a positions.PositionEncoding"):
        GPTConfig(pos_encoding="math:sqrt")


def test_register_adds_a_table_row():
    registry = Registry("widget", "model.widget", {"a": 1})
    registry.register("b", 2)
    assert registry.names() == ["a", "b"] and registry["b"] == 2
    with pytest.raises(ValueError, match="may not contain ':'"):
        registry.register("x:y", 3)


def test_the_working_directory_is_searched(tmp_path, monkeypatch):
    (tmp_path / "cwd_module_for_registry.py").write_text("def act(x):\n    return 2 * x\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert ACTIVATIONS["cwd_module_for_registry:act"](3) == 6


# ----------------------------------------------------------------------------- entries


def test_rmsnorm_is_x_over_root_mean_square_times_scale():
    cfg = GPTConfig(n_embd=8, n_head=2)
    x_BxTxD = jax.random.normal(jax.random.key(0), (2, 3, 8)) * 3 + 1
    norm = NORMS["rmsnorm"](cfg, "ln")
    params = norm.init(jax.random.key(1), x_BxTxD)
    assert set(params["params"]) == {"scale"}  # no bias, no centring
    expected = x_BxTxD / jnp.sqrt(jnp.mean(x_BxTxD**2, axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(norm.apply(params, x_BxTxD), expected, rtol=1e-5, atol=1e-6)


def test_relu_squared():
    x = jnp.array([-2.0, -0.5, 0.0, 0.5, 3.0])
    np.testing.assert_array_equal(relu_squared(x), jnp.array([0.0, 0.0, 0.0, 0.25, 9.0]))
    assert ACTIVATIONS["relu2"] is relu_squared


def test_gelu_follows_gelu_approximate():
    x = jnp.linspace(-3, 3, 7)
    cfg = GPTConfig(n_embd=32, n_head=2, n_layer=1, vocab_size=16, block_size=8, dropout=0.0)
    tokens_BxT = jnp.arange(8)[None] % 16
    params = init_params(cfg, jax.random.key(0))
    exact = forward(params, tokens_BxT, cfg)
    tanh = forward(params, tokens_BxT, cfg.replace(gelu_approximate=True))
    named = forward(params, tokens_BxT, cfg.replace(activation="gelu_tanh"))
    np.testing.assert_array_equal(tanh, named)
    assert not np.allclose(exact, tanh, rtol=0, atol=1e-7)
    np.testing.assert_allclose(ACTIVATIONS["gelu"](x), jax.nn.gelu(x, approximate=False))


def test_norm_and_activation_change_the_model_and_keep_its_paths():
    cfg = GPTConfig(n_embd=32, n_head=2, n_layer=1, vocab_size=16, block_size=8, dropout=0.0)
    params = init_params(cfg.replace(norm="rmsnorm", activation="relu2"), jax.random.key(0))
    assert set(params["block_0"]["ln_1"]) == {"scale"}
    assert params["embed"]["tok"]["embedding"].shape == (16, 32)


def test_z_loss_is_log_z_squared():
    logits_ExV = jnp.array([[0.0, 0.0], [1.0, 3.0]])
    expected = jnp.array([jnp.log(2.0) ** 2, jnp.log(jnp.e + jnp.e**3) ** 2])
    np.testing.assert_allclose(z_loss(logits_ExV, jnp.zeros(2, int)), expected, rtol=1e-6)
    assert LOSS_TERMS["z_loss"].weight == 1e-4


def test_loss_terms_parse_names_weights_and_refuse_bad_ones():
    assert parse_terms("") == ()
    assert parse_terms("z_loss") == (("z_loss", 1e-4),)
    assert parse_terms(" z_loss=0.5 ") == (("z_loss", 0.5),)
    assert term_name("my_pkg.mod:entropy") == "entropy"
    with pytest.raises(ValueError, match="not a number"):
        parse_terms("z_loss=big")
    with pytest.raises(ValueError, match="names a term twice"):
        parse_terms("z_loss,z_loss=1")
    with pytest.raises(RegistryError, match="not a known loss term"):
        parse_terms("zloss")


def test_constant_schedule_warms_up_then_holds():
    optim = default.get_config().optim
    schedule = SCHEDULES["constant"](optim, 1000)
    assert float(schedule(0)) == 0.0
    np.testing.assert_allclose(float(schedule(50)), optim.lr / 2, rtol=1e-6)
    assert float(schedule(100)) == float(schedule(999)) == pytest.approx(optim.lr)


def test_cosine_schedule_is_optax_warmup_cosine():
    optim = default.get_config().optim
    expected = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 1500, 1e-4)
    schedule = SCHEDULES["cosine"](optim, 1500)
    chex.assert_trees_all_close(
        [schedule(s) for s in (0, 50, 100, 800, 1500)],
        [expected(s) for s in (0, 50, 100, 800, 1500)],
        rtol=0,
        atol=0,
    )
