"""Registries: names and `module:attr` resolve to entries; what does not resolve is named with
the entries and the fix; the built-in entries compute what their papers say."""

import subprocess
import sys

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default
from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.configs import speedrun_char
from minigpt_jax.model import param_meta
from minigpt_jax.model.layers import ACTIVATIONS, NORMS, relu_squared
from minigpt_jax.model.loss_terms import LOSS_TERMS, parse_terms, term_name, z_loss
from minigpt_jax.model.speed import backend
from minigpt_jax.muon import muon_dimension_numbers
from minigpt_jax.optimizer_entries import muon, muon_ns_dtype
from minigpt_jax.optimizers import OPTIMIZERS, SCHEDULES, decay_mask, make_optimizer
from minigpt_jax.settings.registry import Registry, RegistryError, imported_user_modules


def test_names_and_user_attributes_resolve():
    assert OPTIMIZERS["adamw"] is OPTIMIZERS["minigpt_jax.optimizers:adamw"]
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


def test_the_registry_index_names_every_registry_of_the_package_where_it_lives():
    """REGISTRY_INDEX (config key -> module:NAME, resolved on first use) holds exactly the
    registries the package defines at module level, each under its own config key."""
    import ast
    from pathlib import Path

    from minigpt_jax.settings.registry import REGISTRIES, REGISTRY_INDEX

    package = Path(__file__).resolve().parents[1] / "minigpt_jax"
    defined = {}
    for path in package.rglob("*.py"):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Registry":
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                defined[value.args[1].value] = f"{module}:{target.id}"
    assert defined == REGISTRY_INDEX
    for config_key in REGISTRY_INDEX:
        assert REGISTRIES[config_key].config_key == config_key


def test_the_default_model_imports_no_variant_and_a_pick_imports_its_own():
    """The variants (model/variants/) are named in their registries' tables, not imported: a
    fresh process that builds and runs the default GPT imports none of them, and picking one
    (ALiBi) imports its module and gives the registry's entry."""
    code = (
        "import sys, jax, jax.numpy as jnp\n"
        "from minigpt_jax import GPTConfig, forward, init_params\n"
        "cfg = GPTConfig(vocab_size=16, n_layer=1, n_embd=8, n_head=2, block_size=4)\n"
        "forward(init_params(cfg, jax.random.key(0)), jnp.zeros((1, 4), jnp.int32), cfg)\n"
        "print(sorted(m for m in sys.modules if m.startswith('minigpt_jax.model.variants.')))\n"
        "from minigpt_jax.model.attention_scores import ATTENTION_SCORES\n"
        "from minigpt_jax.model.variants.attention import alibi\n"
        "print(ATTENTION_SCORES['alibi'] is alibi)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert result.stdout.split("\n")[:2] == ["[]", "True"], result.stdout


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
    assert parse_terms("z_loss") == (("z_loss", 1e-4, None),)
    assert parse_terms(" z_loss=0.5 ") == (("z_loss", 0.5, None),)
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


# ----------------------------------------------------------------------------- speedrun entries

SMALL = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
SPEEDRUN = SMALL.replace(
    qk_norm=True,
    zero_init_proj=True,
    logit_softcap=5.0,
    norm="rmsnorm",
    activation="relu2",
    pos_encoding="rope",
)


def _tokens_1xT():
    return jnp.array([[3, 1, 4, 1, 5, 9, 2, 6]])


def test_qk_norm_makes_scores_invariant_to_the_scale_of_queries_and_keys():
    """RMS-normalised q and k: scaling the q/k columns of the qkv kernel changes nothing."""
    cfg = SMALL.replace(qk_norm=True)
    params = init_params(cfg, jax.random.key(0))
    scaled = jax.tree.map(lambda x: x, params)
    kernel = params["block_0"]["attn"]["qkv"]["kernel"]  # (D, 3, H, K)
    scaled["block_0"]["attn"]["qkv"]["kernel"] = kernel.at[:, :2].multiply(7.0)
    scaled["block_0"]["attn"]["qkv"]["bias"] = params["block_0"]["attn"]["qkv"]["bias"] * 7.0
    np.testing.assert_allclose(
        forward(scaled, _tokens_1xT(), cfg), forward(params, _tokens_1xT(), cfg), atol=2e-5
    )
    plain = SMALL
    assert not np.allclose(
        forward(scaled, _tokens_1xT(), plain), forward(params, _tokens_1xT(), plain)
    )


def test_zero_init_projections_start_every_block_as_the_identity():
    cfg = SMALL.replace(zero_init_proj=True, tie_embeddings=False)
    params = init_params(cfg, jax.random.key(0))
    for i in range(cfg.n_layer):
        assert not params[f"block_{i}"]["attn"]["proj"]["kernel"].any()
        assert not params[f"block_{i}"]["mlp"]["proj"]["kernel"].any()
    assert not params["lm_head"]["kernel"].any()  # an untied head reads out zeros: loss log V
    assert params["embed"]["tok"]["embedding"].std() > 0.01
    np.testing.assert_array_equal(forward(params, _tokens_1xT(), cfg), 0.0)


def test_logit_softcap_is_cap_tanh_of_the_tied_readout():
    """With the cap the head is still tied: logits = c·tanh(LN_f(h) @ W_Eᵀ / c); no lm_head."""
    from minigpt_jax.model.gpt import GPT

    cfg = SMALL.replace(logit_softcap=2.0)
    params = init_params(cfg.replace(logit_softcap=0.0), jax.random.key(0))
    params = jax.tree.map(lambda x: x * 30.0 if x.ndim == 2 else x, params)  # big logits
    assert "lm_head" not in params
    h_1xTxD, _ = GPT(cfg).apply({"params": params}, _tokens_1xT(), method=GPT.hidden)
    plain_1xTxV = h_1xTxD @ params["embed"]["tok"]["embedding"].T
    capped_1xTxV = forward(params, _tokens_1xT(), cfg)
    np.testing.assert_allclose(
        capped_1xTxV, 2.0 * jnp.tanh(plain_1xTxV / 2.0), rtol=1e-5, atol=1e-5
    )
    assert np.abs(capped_1xTxV).max() < 2.0 < np.abs(plain_1xTxV).max()


def test_speedrun_model_stays_causal():
    """Editing token t leaves the logits before t unchanged, all speedrun entries on."""
    params = init_params(SPEEDRUN.replace(zero_init_proj=False), jax.random.key(0))
    tokens_1xT = _tokens_1xT()
    edited = tokens_1xT.at[0, 5].set(0)
    before, after = forward(params, tokens_1xT, SPEEDRUN), forward(params, edited, SPEEDRUN)
    np.testing.assert_array_equal(before[:, :5], after[:, :5])
    assert not np.allclose(before[:, 5:], after[:, 5:])


def test_wsd_schedule_warms_up_holds_then_decays_linearly():
    optim = default.get_config().optim
    optim.warmup_steps, optim.decay_fraction, optim.min_lr = 10, 0.25, 0.0
    schedule = SCHEDULES["wsd"](optim, 100)
    values = [float(schedule(s)) for s in (0, 5, 10, 50, 75, 87.5, 100)]
    np.testing.assert_allclose(values, [0, 5e-4, 1e-3, 1e-3, 1e-3, 5e-4, 0], atol=1e-9)


@pytest.mark.slow
def test_muon_orthogonalises_the_blocks_matrices_and_adamw_the_rest():
    """Muon's first update of a block kernel has (nearly) equal singular values (Newton-Schulz
    orthogonalisation); the embedding's first update is Adam's, -lr·sign(g), elementwise."""
    config = default.get_config()
    config.optim.name, config.optim.warmup_steps, config.optim.weight_decay = "muon", 0, 0.0
    tx, _ = make_optimizer(config.optim, 100)
    params = init_params(SMALL, jax.random.key(0))
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), p.shape), params)
    updates, _ = tx.update(grads, tx.init(params), params)
    singular = np.linalg.svd(
        np.asarray(updates["block_0"]["mlp"]["fc"]["kernel"]), compute_uv=False
    )
    assert singular.max() / singular.min() < 2.0  # a raw Gaussian matrix's is far larger
    raw = np.linalg.svd(np.asarray(grads["block_0"]["mlp"]["fc"]["kernel"]), compute_uv=False)
    assert raw.max() / raw.min() > 3.0
    qkv = np.asarray(updates["block_0"]["attn"]["qkv"]["kernel"])  # (D, 3, H, K): q, k, v apart
    for i in range(3):
        s = np.linalg.svd(qkv[:, i].reshape(32, -1), compute_uv=False)
        assert s.max() / s.min() < 2.0
    embed_update = np.asarray(updates["embed"]["tok"]["embedding"])
    embed_grad = np.asarray(grads["embed"]["tok"]["embedding"])
    np.testing.assert_array_equal(np.sign(embed_update), -np.sign(embed_grad))


# A block's Muon matrices as the model declares them (param_meta.declare(muon=...)): the fused qkv
# kernel (D, 3, H, K) read as 3 matrices (D, H·K), the projection (H, K, D) as one (H·K, D), a wide
# and a tall MLP kernel; an embedding table and a norm scale for AdamW.
_MUON_SHAPES = {
    ("embed", "tok", "embedding"): ((16, 8), param_meta.ParamMeta(decay=True)),
    ("block_0", "attn", "qkv", "kernel"): ((8, 3, 2, 4), param_meta.ParamMeta((0, (2, 3)), True)),
    ("block_0", "attn", "proj", "kernel"): ((2, 4, 8), param_meta.ParamMeta(((0, 1), 2), True)),
    ("block_0", "mlp", "fc", "kernel"): ((8, 32), param_meta.ParamMeta((0, 1), True)),
    ("block_0", "mlp", "proj", "kernel"): ((32, 8), param_meta.ParamMeta((0, 1), True)),
    ("block_0", "norm", "scale"): ((8,), param_meta.VECTOR),
}
_MUON_LR = optax.linear_schedule(0.016, 0.0, 10)


def _muon_optim(ns_dtype: str):
    """The speedrun's Muon settings with weight decay on, Newton-Schulz on `ns_dtype` operands."""
    optim = speedrun_char.get_config().optim
    optim.weight_decay, optim.muon_ns_dtype = 0.1, ns_dtype
    return optim


def _muon_steps(tx: optax.GradientTransformation, steps: int = 3) -> list[tuple]:
    """(updates, state) after each of `steps` updates of a tree shaped as _MUON_SHAPES, from the
    same params and the same Gaussian gradients whatever tx."""

    def tree(seed):
        keys = jax.random.split(jax.random.key(seed), len(_MUON_SHAPES))
        leaves = {
            path: jax.random.normal(key, shape)
            for key, (path, (shape, _)) in zip(keys, _MUON_SHAPES.items(), strict=True)
        }
        return flax.traverse_util.unflatten_dict(leaves)

    with param_meta.using({path: meta for path, (_, meta) in _MUON_SHAPES.items()}):
        params, update = tree(0), jax.jit(tx.update)
        state, trajectory = tx.init(params), []
        for step in range(steps):
            updates, state = update(tree(step + 1), state, params)
            params = optax.apply_updates(params, updates)
            trajectory.append((updates, state))
    return trajectory


def test_muon_with_float32_newton_schulz_is_optax_contrib_muon_bit_for_bit():
    """Issue 38: the Muon entry runs its own Newton-Schulz (so that its operands can be
    bfloat16); with float32 operands it is optax.contrib.muon as the entry called it before,
    bit for bit over 3 steps (batched and reshaped matrices, decay, AdamW's leaves), and its
    state holds the same arrays, so checkpoints of earlier Muon runs still resume. The one
    difference is wanted: AdamW's leaves decay only where declared (`decay_mask`), where
    optax.contrib.muon decays all of them, so the norm scale (declared without decay) follows
    optax.contrib.muon with no AdamW decay."""
    optim = _muon_optim("float32")
    ratio = optim.muon_lr / optim.lr

    def before(adam_weight_decay):
        return optax.contrib.muon(
            lambda step: _MUON_LR(step) * ratio,
            beta=optim.muon_momentum,
            weight_decay=optim.weight_decay,
            weight_decay_mask=decay_mask,
            adam_b1=optim.b1,
            adam_b2=optim.b2,
            adam_weight_decay=adam_weight_decay,
            adam_learning_rate=_MUON_LR,
            muon_weight_dimension_numbers=muon_dimension_numbers,
        )

    for (updates, state), (expected, expected_state), (undecayed, _) in zip(
        _muon_steps(muon(optim, _MUON_LR)),
        _muon_steps(before(optim.weight_decay)),
        _muon_steps(before(0.0)),
        strict=True,
    ):
        scale = ("block_0", "norm", "scale")
        flat, flat_expected = (flax.traverse_util.flatten_dict(t) for t in (updates, expected))
        for path, value in flat.items():
            want = flax.traverse_util.flatten_dict(undecayed)[path] if path == scale else None
            chex.assert_trees_all_equal(value, flat_expected[path] if want is None else want)
        assert flat[scale].shape == (8,)
        chex.assert_trees_all_equal(jax.tree.leaves(state), jax.tree.leaves(expected_state))


def test_under_muon_a_leaf_declared_without_decay_is_not_decayed():
    """With zero gradients and weight decay 0.1, Muon's update of an AdamW leaf declared with
    decay (the embedding) is the decay alone, and of one declared without (the norm scale) 0."""
    optim = _muon_optim("float32")
    tx = muon(optim, _MUON_LR)
    with param_meta.using({path: meta for path, (_, meta) in _MUON_SHAPES.items()}):
        params = flax.traverse_util.unflatten_dict(
            {path: jnp.ones(shape) for path, (shape, _) in _MUON_SHAPES.items()}
        )
        updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    np.testing.assert_array_equal(updates["block_0"]["norm"]["scale"], np.zeros(8))
    embedding = np.asarray(updates["embed"]["tok"]["embedding"])
    np.testing.assert_allclose(embedding, -_MUON_LR(0) * optim.weight_decay, rtol=1e-6)


def test_bfloat16_newton_schulz_stays_within_5_percent_of_float32():
    """bfloat16 operands (float32 sums) in the Newton-Schulz dots: each Muon update within 5%
    (relative Frobenius norm) of the float32 one, and rounded (not equal to it); AdamW's updates
    and the float32 momentum unchanged."""
    float32 = _muon_steps(muon(_muon_optim("float32"), _MUON_LR))
    bfloat16 = _muon_steps(muon(_muon_optim("bfloat16"), _MUON_LR))
    for (updates, state), (expected, expected_state) in zip(bfloat16, float32, strict=True):
        chex.assert_trees_all_equal(updates["embed"], expected["embed"])
        chex.assert_trees_all_equal(updates["block_0"]["norm"], expected["block_0"]["norm"])
        muon_state = state.inner_states["muon"].inner_state[0]
        chex.assert_trees_all_equal(
            muon_state.mu, expected_state.inner_states["muon"].inner_state[0].mu
        )
        chex.assert_trees_all_equal_dtypes(
            muon_state.mu, expected_state.inner_states["muon"].inner_state[0].mu
        )
        for name in ("attn", "mlp"):
            for got, want in zip(
                jax.tree.leaves(updates["block_0"][name]),
                jax.tree.leaves(expected["block_0"][name]),
                strict=True,
            ):
                error = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
                assert 0 < error < 0.05, error


def test_muon_ns_dtype_auto_is_bfloat16_where_bfloat16_matmuls_pay(monkeypatch):
    """optim.muon_ns_dtype=auto follows the training step's rule (backend.bf16_matmuls_pay: a CPU
    with AVX512-BF16 or AMX), resolved when the optimizer is built; other values as they are."""
    auto = _muon_optim("auto")
    for pays, resolved in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(backend, "bf16_matmuls_pay", lambda pays=pays: pays)
        assert muon_ns_dtype(auto) == resolved
        assert muon_ns_dtype(_muon_optim("float32")) == "float32"
        assert muon_ns_dtype(_muon_optim("bfloat16")) == "bfloat16"
        ((updates, _),) = _muon_steps(muon(auto, _MUON_LR), steps=1)
        ((expected, _),) = _muon_steps(muon(_muon_optim(resolved), _MUON_LR), steps=1)
        chex.assert_trees_all_equal(updates, expected)


def test_the_user_modules_a_plugin_imports_are_found_in_its_source(tmp_path, monkeypatch):
    """Issue 40, defect 7: the digest covered the plug-in's own module only. Its imports at the
    top, inside a function and relative ones count; the library's and the stdlib's do not."""
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plug.py").write_text(
        "import json\nimport numpy as np\nfrom . import near\n\n\n"
        "def entry(x):\n    from my_far import FAR\n    return x * FAR\n"
    )
    (pkg / "near.py").write_text("from minigpt_jax.settings import registry\nNEAR = 1\n")
    (tmp_path / "my_far.py").write_text("import my_farther\nFAR = 2\n")
    (tmp_path / "my_farther.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = imported_user_modules("my_pkg.plug")
    assert sorted(found) == ["my_far", "my_farther", "my_pkg", "my_pkg.near"]


def test_the_layernorm_entry_is_the_modules_layer_norm():
    """layers.layer_norm is the registry's "layernorm" entry, (cfg, name) -> module (the
    LayerNorm's hand-written VJP lives beside it under another name)."""
    from minigpt_jax.model import layers

    cfg = GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=2, n_embd=8)
    assert NORMS["layernorm"] is layers.layer_norm
    assert isinstance(layers.layer_norm(cfg, "ln"), flax.linen.Module)
