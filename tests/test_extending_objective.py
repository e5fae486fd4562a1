"""A loss term of the step's context (issue 52, item 1): docs/extending/losses.md's multi-token
prediction, one user file in a folder outside the package, reads the batch's targets, the
model's intermediates, the params and its own declared setting (`mtp_ahead`) through
`TermContext`; its gradient equals the explicit sum computed here by hand, and through the
command line every step logs it inside train_loss."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import THREE_TINY_STEPS, cli_in, extending_files

from minigpt_jax import GPTConfig
from minigpt_jax.model.gpt import GPT, init_params
from minigpt_jax.model.loss_terms import LOSS_TERMS, parse_terms
from minigpt_jax.settings.groups import Loss
from minigpt_jax.settings.registry import ContractError
from minigpt_jax.train.step import loss_fn

WEIGHT = 0.3  # my_mtp.mtp's default weight


@pytest.fixture
def mtp_dir(user_dir, monkeypatch):
    (user_dir / "my_mtp.py").write_text(extending_files()["my_mtp.py"])
    monkeypatch.syspath_prepend(str(user_dir))
    return user_dir


def explicit_objective(params, cfg, tokens_BxT1, ahead):
    """mean CE(next token) + 0.3 · mean CE(token t + ahead from the sown extra features), with
    optax's cross-entropy and the tied table read out here."""
    (h_BxTxD, _), state = GPT(cfg).apply(
        {"params": params},
        tokens_BxT1[:, :-1],
        method=GPT.hidden,
        mutable=["intermediates"],
    )
    table_VxD = params["embed"]["tok"]["embedding"][: cfg.vocab_size]
    logits_BxTxV = h_BxTxD @ table_VxD.T
    main = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, tokens_BxT1[:, 1:])
    extra_BxTxD = state["intermediates"][f"block_{cfg.n_layer - 1}"]["mtp_features"][0]
    length = tokens_BxT1.shape[1] - ahead
    extra_logits = extra_BxTxD[:, :length] @ table_VxD.T
    extra = optax.softmax_cross_entropy_with_integer_labels(extra_logits, tokens_BxT1[:, ahead:])
    return main.mean() + WEIGHT * extra.mean()


@pytest.mark.parametrize("ahead", [2, 3])
def test_mtp_gradient_is_the_explicit_sums_and_reads_its_own_setting(mtp_dir, ahead):
    cfg = GPTConfig(
        vocab_size=30, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
        block="my_mtp:MTPBlock",
    )  # fmt: skip
    tokens_BxT1 = jax.random.randint(jax.random.key(3), (4, 9), 0, cfg.vocab_size)
    params = init_params(cfg, jax.random.key(0))
    assert "mtp_proj" in params[f"block_{cfg.n_layer - 1}"]
    loss = Loss(terms="my_mtp:mtp", entry_settings=(("mtp_ahead", ahead),))
    terms = parse_terms(loss.terms, loss)
    assert [(t.key, t.weight, t.options.mtp_ahead) for t in terms] == [
        ("my_mtp:mtp", WEIGHT, ahead)
    ]

    def objective(p):
        return loss_fn(p, tokens_BxT1, cfg, train=False, terms=terms)[0]

    value, aux = loss_fn(params, tokens_BxT1, cfg, train=False, terms=terms)
    want = explicit_objective(params, cfg, tokens_BxT1, ahead)
    np.testing.assert_allclose(value, want, rtol=1e-6)
    np.testing.assert_allclose(value, aux["cross_entropy"] + WEIGHT * aux["mtp"], rtol=1e-6)
    got_grads = jax.grad(objective)(params)
    want_grads = jax.grad(explicit_objective)(params, cfg, tokens_BxT1, ahead)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got_grads, want_grads
    )
    # the setting is read: the other horizon's sum is another number
    other = explicit_objective(params, cfg, tokens_BxT1, 5 - ahead)
    assert abs(float(value) - float(other)) > 1e-4
    # the extra head learns: its projection has a gradient
    assert float(jnp.abs(got_grads[f"block_{cfg.n_layer - 1}"]["mtp_proj"]["kernel"]).max()) > 0


def test_mtp_without_its_setting_takes_the_declared_default(mtp_dir):
    (term,) = parse_terms("my_mtp:mtp")
    assert term.options.mtp_ahead == 2
    assert set(LOSS_TERMS.settings_of("my_mtp:mtp")) == {"mtp_ahead"}


@pytest.mark.slow
def test_mtp_trains_through_the_command_line(mtp_dir):
    """From the user's folder: train_loss = cross_entropy + 0.3 · mtp at every step, with
    mtp_ahead=3 set on the command line, and evaluation logs val_mtp."""
    cli_in(
        mtp_dir,
        *THREE_TINY_STEPS,
        "--config.model.block=my_mtp:MTPBlock",
        "--config.loss.terms=my_mtp:mtp",
        "--config.loss.mtp_ahead=3",
    )
    lines = (mtp_dir / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    steps = [r for r in records if "train_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["mtp"] > 0
        assert r["train_loss"] == pytest.approx(r["cross_entropy"] + WEIGHT * r["mtp"], rel=1e-6)
    assert any("val_mtp" in r for r in records)


def test_a_context_term_of_weight_0_is_a_metric_and_a_non_scalar_one_is_named(mtp_dir, tmp_path):
    cfg = GPTConfig(
        vocab_size=30, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
        block="my_mtp:MTPBlock",
    )  # fmt: skip
    tokens_BxT1 = jax.random.randint(jax.random.key(4), (2, 9), 0, cfg.vocab_size)
    params = init_params(cfg, jax.random.key(1))
    metric_terms = parse_terms("my_mtp:mtp=0")
    (value, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, tokens_BxT1, cfg, train=False, terms=metric_terms
    )
    (plain_value, _), plain_grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, tokens_BxT1, cfg, train=False
    )
    assert float(aux["mtp"]) > 0 and float(value) == float(plain_value)
    jax.tree.map(np.testing.assert_array_equal, grads, plain_grads)

    (mtp_dir / "my_wide.py").write_text(
        "from minigpt_jax.model.loss_terms import LossTerm\n"
        "wide = LossTerm(of_context=lambda ctx: ctx.targets_BxT * 1.0)\n"
    )
    with pytest.raises(ContractError, match=r"loss term 'my_wide:wide' returned shape \(2, 8\)"):
        loss_fn(params, tokens_BxT1, cfg, train=False, terms=parse_terms("my_wide:wide"))
