"""Distillation from a teacher run (issue 52): docs/extending/losses.md's my_distill.py, one user
file in a folder outside the package, reads the batch's inputs (to run the teacher on them), the
student's features and params and its own declared settings (the teacher's path, the
temperature) through `TermContext`; its value and gradient equal the explicit sum computed here
with optax's cross-entropy and KL divergence, and through the command line every step logs it
inside train_loss."""

import json

import jax
import numpy as np
import optax
import pytest
from helpers import THREE_TINY_STEPS, cli_in, extending_files, trained_tiny

from minigpt_jax import GPTConfig, load_model
from minigpt_jax.model.gpt import GPT, init_params
from minigpt_jax.model.loss_terms import parse_terms
from minigpt_jax.settings.groups import Loss
from minigpt_jax.train.step import loss_fn

WEIGHT = 0.5  # my_distill.distill's default weight


@pytest.fixture(scope="module")
def teacher_dir(corpus_file, tmp_path_factory):
    """The teacher: configs/tiny.py trained 4 steps on the suite's corpus."""
    return trained_tiny(tmp_path_factory.mktemp("teacher"), corpus_file, steps=4)


@pytest.fixture
def distill_dir(user_dir, monkeypatch):
    (user_dir / "my_distill.py").write_text(extending_files()["my_distill.py"])
    monkeypatch.syspath_prepend(str(user_dir))
    return user_dir


def explicit_objective(params, cfg, tokens_BxT1, teacher, temperature):
    """mean CE(next token) + 0.5 · T² · mean KL(softmax(teacher / T) ‖ softmax(student / T)),
    with optax's cross-entropy and KL divergence and the tied table read out here."""
    h_BxTxD, _ = GPT(cfg).apply({"params": params}, tokens_BxT1[:, :-1], method=GPT.hidden)
    logits_BxTxV = h_BxTxD @ params["embed"]["tok"]["embedding"][: cfg.vocab_size].T
    main = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, tokens_BxT1[:, 1:])
    teacher_logits_BxTxV, _ = GPT(teacher.cfg).apply(
        {"params": teacher.params}, tokens_BxT1[:, :-1]
    )
    kl_BxT = optax.kl_divergence(
        jax.nn.log_softmax(logits_BxTxV / temperature),
        jax.nn.softmax(teacher_logits_BxTxV / temperature),
    )
    return main.mean() + WEIGHT * temperature**2 * kl_BxT.mean()


def _student(vocab_size):
    return GPTConfig(
        vocab_size=vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.0
    )


def _terms(teacher_dir, temperature):
    loss = Loss(
        terms="my_distill:distill",
        entry_settings=(("teacher", str(teacher_dir)), ("distill_temperature", temperature)),
    )
    return parse_terms(loss.terms, loss)


@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_distillation_gradient_is_the_explicit_sums(distill_dir, teacher_dir, temperature):
    teacher = load_model(teacher_dir)
    cfg = _student(teacher.cfg.vocab_size)
    tokens_BxT1 = jax.random.randint(jax.random.key(5), (4, 9), 0, cfg.vocab_size)
    params = init_params(cfg, jax.random.key(0))
    terms = _terms(teacher_dir, temperature)
    assert [(t.key, t.weight, t.options.distill_temperature) for t in terms] == [
        ("my_distill:distill", WEIGHT, temperature)
    ]

    def objective(p):
        return loss_fn(p, tokens_BxT1, cfg, train=False, terms=terms)[0]

    value, aux = loss_fn(params, tokens_BxT1, cfg, train=False, terms=terms)
    want = explicit_objective(params, cfg, tokens_BxT1, teacher, temperature)
    np.testing.assert_allclose(value, want, rtol=1e-6)
    np.testing.assert_allclose(value, aux["cross_entropy"] + WEIGHT * aux["distill"], rtol=1e-6)
    assert float(aux["distill"]) > 0
    got_grads = jax.grad(objective)(params)
    want_grads = jax.grad(explicit_objective)(params, cfg, tokens_BxT1, teacher, temperature)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got_grads, want_grads
    )
    # the temperature is read: the other one's sum is another number
    other = explicit_objective(params, cfg, tokens_BxT1, teacher, 5.0 - temperature)
    assert abs(float(value) - float(other)) > 1e-4


def test_a_teacher_of_another_vocabulary_is_named(distill_dir, teacher_dir):
    teacher = load_model(teacher_dir)
    cfg = _student(teacher.cfg.vocab_size + 1)
    tokens_BxT1 = jax.random.randint(jax.random.key(6), (2, 9), 0, cfg.vocab_size)
    params = init_params(cfg, jax.random.key(0))
    with pytest.raises(ValueError, match=r"has \d+ tokens, this model \d+: train on the teacher"):
        loss_fn(params, tokens_BxT1, cfg, train=False, terms=_terms(teacher_dir, 2.0))


@pytest.mark.slow
def test_distillation_trains_through_the_command_line(distill_dir, teacher_dir):
    """From the user's folder, on the teacher's corpus and tokenizer settings: train_loss =
    cross_entropy + 0.5 · distill at every step, and evaluation logs val_distill."""
    cli_in(
        distill_dir,
        *THREE_TINY_STEPS,
        "--config.model.n_layer=1",
        "--config.loss.terms=my_distill:distill",
        f"--config.loss.teacher={teacher_dir}",
        "--config.loss.distill_temperature=3",
    )
    records = [
        json.loads(line)
        for line in (distill_dir / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if "train_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["distill"] > 0
        want = r["cross_entropy"] + WEIGHT * r["distill"]
        assert r["train_loss"] == pytest.approx(want, rel=1e-6)
    assert any("val_distill" in r for r in records)
