"""μP as a parametrization entry (`model.parametrization=mup`, model/parametrization.py): at
the base width it is the standard model, exactly; off it the hidden matrices' init is scaled by
1/√m and their Adam rate by 1/m, the read-out by 1/m, attention by √K_base/K; the coordinate
check's slopes are flat under μP and grow under the standard parametrization; and the learning
rate transfer check (slow)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import run, train_args

from minigpt_apps.scale.coord_check import coord_check
from minigpt_apps.scale.lr_transfer import best_rate_index, lr_transfer, verdict
from minigpt_apps.scale.width_runs import Family
from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.model import param_meta
from minigpt_jax.model.parametrization import MupOptions
from minigpt_jax.model_files import load_model
from minigpt_jax.optimizer_wrappers import scale_by_parametrization
from minigpt_jax.optimizers import build_optimizer
from minigpt_jax.settings.groups import Optim, options_of
from minigpt_jax.settings.registry import RegistryError
from minigpt_jax.train.step import init_state, train_step

CFG = GPTConfig(vocab_size=40, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
BATCH_BxT1 = jax.random.randint(jax.random.key(7), (4, 9), 0, CFG.vocab_size)
TOKENS_BxT = BATCH_BxT1[:, :-1]


def mup(cfg: GPTConfig, base_width: int, **settings) -> GPTConfig:
    return cfg.replace(parametrization="mup", mup_base_width=base_width, **settings)


def leaves(tree) -> dict[str, np.ndarray]:
    return {
        "/".join(param_meta.path_names(path)): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def assert_same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert got.keys() == expected.keys()
    for path, value in expected.items():
        np.testing.assert_array_equal(got[path], value, err_msg=path)


def steps(cfg: GPTConfig, optim: Optim, model: GPTConfig | None, count: int = 3):
    """(params, losses) after `count` train steps of cfg's model (the optimizer built for
    `model`'s parametrization; None: none given)."""
    parts = build_optimizer(optim, 10, model)
    state = init_state(cfg, parts.tx, jax.random.key(0))
    losses = []
    for _ in range(count):
        state, metrics = train_step(
            state, BATCH_BxT1, cfg=cfg, tx=parts.tx, schedule=parts.schedule
        )
        losses.append(float(metrics["loss"]))
    return leaves(state.params), losses


ADAMW = Optim(warmup_steps=0, schedule="constant", lr=1e-2)
MUON = Optim(warmup_steps=0, schedule="constant", lr=1e-2, name="muon", muon_ns_dtype="float32")


def test_the_default_is_standard_and_its_optimizer_is_the_one_built_without_a_model():
    assert CFG.parametrization == "standard"
    bare, with_model = (build_optimizer(ADAMW, 10, model) for model in (None, CFG))
    params = init_params(CFG, jax.random.key(0))
    assert jax.tree.structure(bare.tx.init(params)) == jax.tree.structure(
        with_model.tx.init(params)
    )
    (bare_params, bare_losses), (params_after, losses) = (
        steps(CFG, ADAMW, model) for model in (None, CFG)
    )
    assert losses == bare_losses
    assert_same(params_after, bare_params)


@pytest.mark.parametrize("optim", [ADAMW, MUON], ids=["adamw", "muon"])
def test_mup_at_the_base_width_is_the_standard_model_exactly(optim):
    at_base = mup(CFG, base_width=CFG.n_embd)
    standard_params = leaves(init_params(CFG, jax.random.key(0)))
    mup_params = leaves(init_params(at_base, jax.random.key(0)))
    assert_same(mup_params, standard_params)
    params = init_params(CFG, jax.random.key(0))
    np.testing.assert_array_equal(
        forward(params, TOKENS_BxT, at_base), forward(params, TOKENS_BxT, CFG)
    )
    standard_after, standard_losses = steps(CFG, optim, CFG)
    mup_after, mup_losses = steps(at_base, optim, at_base)
    assert mup_losses == standard_losses
    assert_same(mup_after, standard_after)


def test_mup_inits_hidden_matrices_at_one_over_root_m_and_keeps_the_rest():
    wide = CFG.replace(n_embd=64)  # m = 64 / 16 = 4: hidden std x 1/2
    standard = leaves(init_params(wide, jax.random.key(3)))
    scaled = leaves(init_params(mup(wide, base_width=16), jax.random.key(3)))
    hidden = {
        "block_0/attn/qkv/kernel",
        "block_0/attn/proj/kernel",
        "block_0/mlp/fc/kernel",
        "block_0/mlp/proj/kernel",
    }
    assert hidden <= standard.keys()
    for path, value in standard.items():
        expected = value / 2 if path.rpartition("/")[2] == "kernel" else value
        np.testing.assert_array_equal(scaled[path], expected, err_msg=path)
    assert "embed/tok/embedding" in standard and "block_1/ln_1/scale" in standard


def test_mup_scales_adam_rates_of_hidden_matrices_by_one_over_m_and_not_muons():
    wide = mup(CFG.replace(n_embd=64), base_width=16)
    params = init_params(wide, jax.random.key(0))  # records the parameters' metadata
    ones = jax.tree.map(jnp.ones_like, params)
    for orthogonalised, hidden_factor in ((False, 0.25), (True, 1.0)):
        tx = scale_by_parametrization(wide, lambda meta, o=orthogonalised: o and bool(meta.muon))
        scaled, _ = tx.update(ones, tx.init(params), params)
        for path, value in leaves(scaled).items():
            factor = hidden_factor if path.endswith("kernel") else 1.0
            assert np.all(value == factor), (path, orthogonalised)
    assert scale_by_parametrization(CFG, lambda meta: False) is None


def test_the_muon_optimizer_keeps_its_matrices_rates_under_mup():
    wide = mup(CFG.replace(n_embd=64), base_width=16)
    params = init_params(wide, jax.random.key(0))
    grads = jax.tree.map(jnp.ones_like, params)

    def update(model):
        parts = build_optimizer(MUON, 10, model)
        return leaves(parts.tx.update(grads, parts.tx.init(params), params)[0])

    assert_same(update(wide), update(None))


def test_mup_reads_out_through_h_over_m():
    # K_base = K: the attention is the standard one, so only the read-out differs.
    wide = CFG.replace(n_embd=64)
    params = init_params(wide, jax.random.key(1))
    scaled = mup(wide, base_width=16, mup_base_head_dim=wide.head_dim)
    standard_logits = forward(params, TOKENS_BxT, wide)
    np.testing.assert_array_equal(forward(params, TOKENS_BxT, scaled), standard_logits / 4)
    untied = wide.replace(tie_embeddings=False)
    untied_params = init_params(untied, jax.random.key(1))
    np.testing.assert_array_equal(
        forward(untied_params, TOKENS_BxT, mup(untied, 16, mup_base_head_dim=untied.head_dim)),
        forward(untied_params, TOKENS_BxT, untied) / 4,
    )


def test_mup_scales_attention_scores_by_root_k_base_over_k():
    # m = 1, K = 8, K_base = 2: scores x sqrt(2) / 8 = (1/sqrt(8)) x 1/2, as halving q would.
    cfg = mup(CFG, base_width=16, mup_base_head_dim=2)
    params = init_params(CFG, jax.random.key(2))
    halved_q = jax.tree.map(lambda x: x, params)
    qkv = halved_q["block_0"]["attn"]["qkv"]
    qkv["kernel"] = qkv["kernel"].at[:, 0].multiply(0.5)
    qkv["bias"] = qkv["bias"].at[0].multiply(0.5)
    qkv1 = halved_q["block_1"]["attn"]["qkv"]
    qkv1["kernel"] = qkv1["kernel"].at[:, 0].multiply(0.5)
    qkv1["bias"] = qkv1["bias"].at[0].multiply(0.5)
    np.testing.assert_allclose(
        forward(params, TOKENS_BxT, cfg),
        forward(halved_q, TOKENS_BxT, CFG),
        rtol=1e-6,
        atol=1e-7,
    )
    assert not np.allclose(forward(params, TOKENS_BxT, cfg), forward(params, TOKENS_BxT, CFG))


def test_bad_mup_settings_are_one_line_errors():
    positive = r"mup_base_width must be a positive integer below 131072, got 0"
    with pytest.raises(ValueError, match=positive) as error:
        mup(CFG, base_width=0)
    assert "\n" not in str(error.value)
    with pytest.raises(TypeError, match="neither a field nor a setting of the picked entries"):
        CFG.replace(mup_base_width=64)  # standard declares no base width
    with pytest.raises(RegistryError, match="did you mean 'mup'"):
        CFG.replace(parametrization="mpu")


def test_a_users_parametrization_is_picked_by_module_attr(tmp_path, monkeypatch):
    (tmp_path / "my_param.py").write_text(
        "from minigpt_jax.model.parametrization import Parametrization\n"
        "HALF_READOUT = Parametrization(readout=lambda cfg: 0.5)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = CFG.replace(parametrization="my_param:HALF_READOUT")
    params = init_params(CFG, jax.random.key(0))
    np.testing.assert_array_equal(
        forward(params, TOKENS_BxT, cfg), forward(params, TOKENS_BxT, CFG) / 2
    )


def test_the_command_line_trains_a_mup_model_and_records_its_base_width(tmp_path, corpus_file):
    workdir = tmp_path / "run"
    result = run(
        train_args(
            workdir,
            corpus_file,
            "--config.num_steps=4",
            "--config.eval_every=2",
            "--config.checkpoint_every=2",
            "--config.model.parametrization=mup",
            "--config.model.mup_base_width=16",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = load_model(workdir).cfg
    assert cfg.parametrization == "mup"
    assert options_of(cfg, MupOptions) == MupOptions(mup_base_width=16)


# ----------------------------------------------------------------------------- the checks

TINY_FAMILY = Family(n_layer=2, n_head=2, block_size=16, batch_size=4, base_width=16)


def test_the_coordinate_check_is_flat_under_mup_and_grows_under_standard():
    check = coord_check((16, 32, 64), family=TINY_FAMILY, steps=2, seeds=(0,))
    assert check.scales["mup"]["logits"].shape == (3, 3)  # steps + 1 rows, widths across
    for layer, slope in check.slopes["mup"].items():
        assert abs(slope) < 0.25, (layer, slope)
    assert abs(check.slopes["standard"]["embedding"]) < 0.25  # Adam moves a table by ~lr
    for layer in ("block_0", "block_1", "logits"):
        assert check.slopes["standard"][layer] > 0.6, (layer, check.slopes["standard"][layer])
    # At init (row 0), before any update, both parametrizations agree at the base width.
    np.testing.assert_allclose(
        check.scales["mup"]["block_1"][0, 0], check.scales["standard"]["block_1"][0, 0]
    )


def test_the_best_rate_and_the_verdict_follow_the_stated_rule():
    lrs = (1e-3, 2e-3, 4e-3)
    narrow_SxR = np.array([[3.0, 2.0, 2.5], [3.1, 2.1, 2.4]])
    assert best_rate_index(narrow_SxR) == 1
    assert best_rate_index(np.array([[1.0, np.nan], [1.0, 0.5]])) == 0  # a diverged seed
    # The wide width's best is its first rate, far better at every seed: no transfer.
    far = verdict("x", (8, 32), lrs, {8: narrow_SxR, 32: np.array([[1.0, 2.0, 3], [1.1, 2.2, 3]])})
    assert far.best_lr == {8: 2e-3, 32: 1e-3} and far.shift_log2 == -1.0
    assert not far.transfers
    assert far.penalty.mean_diff == pytest.approx(1.05)  # (1.0 + 1.1) / 2 between the columns
    # A wide best one rate away, within the seeds' noise (paired differences -0.1, +0.3).
    near = verdict("x", (8, 32), lrs, {8: narrow_SxR, 32: np.array([[1.0, 0.9, 3], [1.0, 1.3, 3]])})
    assert near.best_lr[32] == 1e-3 and near.transfers


@pytest.mark.slow
def test_the_best_learning_rate_transfers_under_mup_and_shifts_under_standard():
    result = lr_transfer(
        16,
        lrs=tuple(2.0**k for k in range(-10, -3)),
        family=TINY_FAMILY,
        steps=60,
        warmup_steps=6,
        tail=10,
        seeds=(0, 1),
    )
    assert result.verdicts["mup"].transfers
    assert result.verdicts["standard"].shift_log2 < result.verdicts["mup"].shift_log2
