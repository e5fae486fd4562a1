"""A researcher's changes as files of their own: docs/extending/'s examples, written into a
folder outside the package, train through the command line's `module:attr` form, show up in
the metrics and resume bit-exactly; and each one computes what it says."""

import struct
import subprocess
import sys
from pathlib import Path

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import extending_files, pydoc_text, train_args
from tensorboardX.proto import event_pb2

from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.config_dict import check_experiment_config, default_config
from minigpt_jax.model.loss_terms import parse_terms
from minigpt_jax.optimizers import make_optimizer
from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.settings import options_of
from minigpt_jax.settings.registry import RegistryError
from minigpt_jax.train.metrics import read_metrics
from minigpt_jax.train.step import loss_fn

# The full suite only (`python -m pytest -q`): plug-ins trained through the CLI.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PLUGINS = [
    "--config.optim.name=my_opts:lion",
    "--config.model.attention_mask=my_masks:sliding_window",
    "--config.loss.terms=my_losses:entropy=0.01",
    "--config.model.pos_encoding=my_positions:HALF_SINUSOIDS",
    "--config.optim.schedule=constant",  # a schedule that does not depend on num_steps
]


def doc_files() -> dict[str, str]:
    """{file name: source} of every ```python block of docs/extending/ that opens with
    `# name.py`."""
    return extending_files()


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """A folder outside the package holding the docs' files, importable as top-level modules."""
    folder = tmp_path_factory.mktemp("user_code")
    for name, source in doc_files().items():
        folder.joinpath(name).write_text(source)
    (folder / "corpus.txt").write_text(pydoc_text())
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def _train(user_dir, workdir, *extra):
    args = train_args(
        workdir,
        user_dir / "corpus.txt",
        "--config.eval_every=10",
        "--config.checkpoint_every=10",
        *PLUGINS,
        *extra,
    )
    # The user's folder is the working directory, as for a researcher running their study.
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=user_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _tensorboard_tags(workdir: Path) -> set[str]:
    """The scalar tags of every event file (TFRecord frames of Event protos)."""
    tags = set()
    for path in (workdir / "tensorboard").glob("events.out.tfevents.*"):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            tags.update(value.tag for value in event.summary.value)
            offset += 12 + length + 4
    return tags


def test_the_docs_hold_every_example():
    assert set(doc_files()) == {
        "my_opts.py",
        "my_masks.py",
        "my_losses.py",
        "my_positions.py",
        "my_mlp.py",
        "my_blocks.py",
        "my_scores.py",
        "my_kernels.py",
        "my_schedule_free.py",
        "my_metrics.py",
        "my_formats.py",
        "my_config.py",
        "my_aux.py",
        "my_hooks.py",
        "my_tokenizers.py",
        "my_mtp.py",
        "my_sam.py",
        "my_lora.py",
        "my_step_blocks.py",
        "my_distill.py",
        "my_value_residual.py",
    }


@pytest.mark.slow
def test_user_code_trains_logs_and_resumes_bit_exactly(user_dir, tmp_path):
    """All four user entries at once, named on the command line: the loss term is logged in
    training and evaluation, to metrics.jsonl and TensorBoard; a run stopped at step 10 and
    resumed to 20 equals a run of 20 steps."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _train(user_dir, whole, "--config.num_steps=20")
    _train(user_dir, resumed, "--config.num_steps=10")
    second = _train(user_dir, resumed, "--config.num_steps=20")
    assert "resumed from step 10" in second.stdout

    vocab_size = load_params(whole)[1]["gpt_config"]["vocab_size"]
    records = read_metrics(whole)
    train_rows = [r for r in records if "train_loss" in r]
    eval_rows = [r for r in records if "val_loss" in r]
    assert len(train_rows) == 20 and len(eval_rows) == 2
    for row in train_rows:
        # The objective is the cross-entropy plus 0.01 x the mean entropy.
        np.testing.assert_allclose(
            row["train_loss"], row["cross_entropy"] + 0.01 * row["entropy"], rtol=1e-6
        )
        assert 0 < row["entropy"] <= np.log(vocab_size) + 1e-5  # at most log V nats
    assert {"val_entropy", "eval_train_entropy", "val_loss"} <= set(eval_rows[-1])
    tags = _tensorboard_tags(whole)
    assert {"entropy", "cross_entropy", "val_entropy", "eval_train_entropy"} <= tags

    assert _without_speed(read_metrics(resumed)) == _without_speed(read_metrics(whole))
    chex.assert_trees_all_equal(load_params(whole)[0], load_params(resumed)[0])


def _without_speed(records: list[dict]) -> list[dict]:
    """The records without tokens_per_sec, a wall-clock figure."""
    return [{k: v for k, v in r.items() if k != "tokens_per_sec"} for r in records]


def test_a_missing_user_module_is_named_with_the_fix(user_dir):
    config = default_config()
    config.optim.name = "no_such_module:lion"
    with pytest.raises(RegistryError, match=r"no_such_module:lion.*PYTHONPATH.*adamw"):
        check_experiment_config(config)
    config.optim.name = "lionn"
    with pytest.raises(RegistryError, match=r"not a known optimizer.*module:attr"):
        check_experiment_config(config)


# ----------------------------------------------------------------------------- what each computes


CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)


def _tokens_BxT(length=12):
    return jax.random.randint(jax.random.key(3), (2, length), 0, CFG.vocab_size)


def test_user_optimizer_is_optax_lion(user_dir):
    """One step through make_optimizer equals clipping, then optax.lion on the schedule."""
    config = default_config()
    config.optim.name = "my_opts:lion"
    tx, schedule = make_optimizer(config.optim, 100)
    params = init_params(CFG, jax.random.key(0))
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    updates, _ = tx.update(grads, tx.init(params), params)
    from my_opts import decay_mask  # the user file's own import of the package's mask

    reference = optax.chain(
        optax.clip_by_global_norm(config.optim.grad_clip),
        optax.lion(schedule, b1=0.9, b2=0.99, weight_decay=0.1, mask=decay_mask),
    )
    expected, _ = reference.update(grads, reference.init(params), params)
    chex.assert_trees_all_close(updates, expected, rtol=1e-6, atol=0)


def test_user_mask_is_a_sliding_window(user_dir):
    """Logits at t depend on tokens t-3..t only, and differ from full causal attention."""
    cfg = CFG.replace(attention_mask="my_masks:sliding_window", pos_encoding="rope")
    params = init_params(cfg, jax.random.key(0))
    tokens_BxT = _tokens_BxT()
    logits_BxTxV = forward(params, tokens_BxT, cfg)
    # One layer reaches 3 back, two layers 6: editing token 2 leaves positions >= 9 unchanged.
    edited_BxT = tokens_BxT.at[:, 2].set((tokens_BxT[:, 2] + 1) % cfg.vocab_size)
    edited_logits_BxTxV = forward(params, edited_BxT, cfg)
    np.testing.assert_array_equal(logits_BxTxV[:, 9:], edited_logits_BxTxV[:, 9:])
    assert not np.allclose(logits_BxTxV[:, 2:9], edited_logits_BxTxV[:, 2:9])
    causal_BxTxV = forward(params, tokens_BxT, cfg.replace(attention_mask="causal"))
    np.testing.assert_array_equal(logits_BxTxV[:, :4], causal_BxTxV[:, :4])
    assert not np.allclose(logits_BxTxV[:, 4:], causal_BxTxV[:, 4:])


def test_user_loss_term_adds_its_weighted_mean(user_dir):
    terms = parse_terms("my_losses:entropy=0.01")
    assert terms == (("my_losses:entropy", 0.01, None),)
    params = init_params(CFG, jax.random.key(0))
    batch_BxT1 = _tokens_BxT(13)
    objective, aux = loss_fn(params, batch_BxT1, CFG, train=False, terms=terms)
    logits_BxTxV = forward(params, batch_BxT1[:, :-1], CFG)
    p_BxTxV = jax.nn.softmax(logits_BxTxV)
    entropy = float(-(p_BxTxV * jnp.log(p_BxTxV)).sum(-1).mean())
    cross_entropy = float(
        optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, batch_BxT1[:, 1:]).mean()
    )
    np.testing.assert_allclose(aux["entropy"], entropy, rtol=1e-5)
    np.testing.assert_allclose(aux["cross_entropy"], cross_entropy, rtol=1e-5)
    np.testing.assert_allclose(objective, cross_entropy + 0.01 * entropy, rtol=1e-5)


def test_user_position_encoding_adds_half_sinusoids(user_dir):
    """The user's scheme adds 0.5 x the sinusoids to the token embeddings, with no table."""
    from minigpt_jax.model.embeddings import Embeddings
    from minigpt_jax.model.positions import sinusoidal_at

    cfg = CFG.replace(pos_encoding="my_positions:HALF_SINUSOIDS")
    embed = Embeddings(cfg)
    tokens_BxT = _tokens_BxT()
    variables = nn.unbox(embed.init(jax.random.key(0), tokens_BxT))
    x_BxTxD = embed.apply(variables, tokens_BxT)
    table_VxD = variables["params"]["tok"]["embedding"]
    expected_BxTxD = table_VxD[tokens_BxT] + 0.5 * sinusoidal_at(jnp.arange(12), 32)[None]
    np.testing.assert_allclose(x_BxTxD, expected_BxTxD, rtol=1e-6, atol=1e-6)
    assert "pos" not in variables["params"]


def test_user_rotary_entry_reads_its_own_base(user_dir):
    """my_positions:ROPE at base 10000 is the built-in rope bit for bit; its base is its own."""
    cfg = CFG.replace(pos_encoding="rope")
    user = CFG.replace(pos_encoding="my_positions:ROPE")
    import my_positions

    assert options_of(user, my_positions.ROPE) == my_positions.RopeBase(base=10000.0)
    params = init_params(cfg, jax.random.key(0))
    tokens_BxT = _tokens_BxT()
    builtin = forward(params, tokens_BxT, cfg)
    np.testing.assert_array_equal(forward(params, tokens_BxT, user), builtin)
    np.testing.assert_array_equal(
        forward(params, tokens_BxT, user.replace(base=5e5)),
        forward(params, tokens_BxT, cfg.replace(rope_theta=5e5)),
    )
    assert not np.array_equal(forward(params, tokens_BxT, user.replace(base=5e5)), builtin)
