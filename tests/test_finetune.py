"""Fine-tuning with plug-ins (issue 52, item 5): `config.init_from` loads a checkpoint into a
model whose plug-ins add parameters (docs/extending/model.md's LoRA MLP, a file of the user's
own outside the package), each weight where its path is, the new ones at the model's init; a
weight with no home or of another shape is refused by name; `optim.frozen_tags` gives the
frozen parameters no update at all. Through the command line: a run, its LoRA fine-tuning
(base weights bit-identical, adapters moved), and sampling."""

import shlex

import jax
import ml_collections
import numpy as np
import optax
import pytest
from helpers import REPO, cli_in, extending_files

from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.finetune import fitted_params, new_parameters
from minigpt_jax.model_files import LoadedModel, shape_mismatch
from minigpt_jax.optimizers import make_optimizer
from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.settings.groups import Optim, check_values, defaults
from minigpt_jax.train.step import init_state, train_step

BASE = GPTConfig(vocab_size=30, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
LORA = {"mlp": "my_lora:LoRAMLP"}  # the fine-tuned model: BASE.replace(**LORA), once importable
ADAPTERS = [
    f"block_{i}/mlp/{part}_lora/{name}"
    for i in range(2)
    for part in ("fc", "proj")
    for name in ("a", "b")
]
BATCH_BxT1 = jax.random.randint(jax.random.key(7), (4, 9), 0, BASE.vocab_size)


@pytest.fixture
def lora_dir(user_dir, monkeypatch):
    (user_dir / "my_lora.py").write_text(extending_files()["my_lora.py"])
    monkeypatch.syspath_prepend(str(user_dir))
    return user_dir


def _loaded(cfg=BASE, seed=0):
    return LoadedModel(cfg, init_params(cfg, jax.random.key(seed)), tokenizer=None)


def test_lora_takes_every_base_weight_and_starts_as_the_base_model(lora_dir):
    lora_cfg, base = BASE.replace(**LORA), _loaded()
    assert shape_mismatch(BASE, lora_cfg) == []  # model.mlp names a plug-in: the paths decide
    assert sorted(new_parameters(base, lora_cfg)) == sorted(ADAPTERS)
    params = fitted_params(init_params(lora_cfg, jax.random.key(1)), base, lora_cfg)
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(params)}
    for path, weight in jax.tree_util.tree_leaves_with_path(base.params):
        np.testing.assert_array_equal(flat[jax.tree_util.keystr(path)], weight)
    assert not np.any(params["block_0"]["mlp"]["fc_lora"]["b"])  # B starts at zero
    tokens_BxT = BATCH_BxT1[:, :-1]
    np.testing.assert_array_equal(
        forward(params, tokens_BxT, lora_cfg), forward(base.params, tokens_BxT, BASE)
    )


def test_a_checkpoint_weight_with_no_home_is_named(user_dir, monkeypatch):
    # The LoRA MLP whose first matrix is renamed: the checkpoint's fc would be left behind.
    source = extending_files()["my_lora.py"].replace('name="fc",', 'name="fc1",')
    assert source != extending_files()["my_lora.py"]
    (user_dir / "my_renamed.py").write_text(source)
    monkeypatch.syspath_prepend(str(user_dir))
    with pytest.raises(ValueError) as caught:
        new_parameters(_loaded(), BASE.replace(mlp="my_renamed:LoRAMLP"))
    message = str(caught.value)
    assert "\n" not in message
    assert "the checkpoint's weights block_0/mlp/fc/bias, block_0/mlp/fc/kernel" in message
    assert "have no place in the config's model; its new parameters: block_0/mlp/fc1/" in message


def test_a_checkpoint_weight_of_another_shape_is_named(user_dir, monkeypatch):
    # The LoRA MLP at twice the hidden width: the same paths, other shapes.
    source = extending_files()["my_lora.py"]
    assert source.count("cfg.mlp_dim") == 2  # fc's width and its adapter's
    source = source.replace("cfg.mlp_dim", "2 * cfg.mlp_dim")
    (user_dir / "my_doubled.py").write_text(source)
    monkeypatch.syspath_prepend(str(user_dir))
    with pytest.raises(ValueError) as caught:
        new_parameters(_loaded(), BASE.replace(mlp="my_doubled:LoRAMLP"))
    assert str(caught.value).startswith(
        "config.init_from: the checkpoint's weight block_0/mlp/fc/bias has shape (64,), the "
        "config's model (128,): give the plug-in's parameter the checkpoint's shape"
    )


def test_settings_both_models_declare_must_match_and_built_in_fields_still_do(lora_dir):
    lora_cfg = BASE.replace(**LORA)
    trained = lora_cfg.replace(lora_rank=4)
    assert shape_mismatch(trained, lora_cfg.replace(lora_rank=4)) == []
    assert shape_mismatch(trained, lora_cfg.replace(lora_rank=8)) == [
        "lora_rank: checkpoint 4, config 8"
    ]
    assert shape_mismatch(BASE, lora_cfg.replace(activation="relu")) == [
        "activation: checkpoint 'gelu', config 'relu'"
    ]
    with pytest.raises(ValueError, match=r"lora_rank: checkpoint 4, config 8\. Set those"):
        new_parameters(_loaded(trained), lora_cfg.replace(lora_rank=8))


# ----------------------------------------------------------------------------- optim.frozen_tags


def _optim(frozen_tags, name="adamw", **changes):
    values = {**defaults(Optim), "name": name, "schedule": "constant", "warmup_steps": 0}
    optim = ml_collections.ConfigDict({**values, **changes})
    optim.frozen_tags = frozen_tags
    return optim


def _steps(optim, cfg=BASE, steps=3):
    tx, schedule = make_optimizer(optim, 10)
    state = init_state(cfg, tx, jax.random.key(0))
    start = state.params
    for _ in range(steps):
        state, _ = train_step(state, BATCH_BxT1, cfg=cfg, tx=tx, schedule=schedule)
    return start, state.params


def _by_path(params):
    return {
        "/".join(str(k.key) for k in p): np.asarray(v)
        for p, v in jax.tree_util.tree_leaves_with_path(params)
    }


def test_frozen_leaves_stay_bit_identical_under_adamw_with_decay():
    start, end = _steps(_optim("attention,untagged", weight_decay=0.5))
    start, end = _by_path(start), _by_path(end)
    frozen = [p for p in start if "/attn/" in p or "/ln_" in p or p.startswith("ln_f")]
    assert len(frozen) == 2 * 4 + 2 * 4 + 2  # qkv, proj (kernel, bias); ln_1, ln_2; ln_f
    for path in start:
        if path in frozen:
            np.testing.assert_array_equal(end[path], start[path], err_msg=path)
        else:
            assert np.abs(end[path] - start[path]).max() > 1e-6, path


def test_frozen_gradients_take_no_share_of_the_clip():
    """SGD at rate 1, clip 0.01: a trainable leaf moves by -g · 0.01 / |g of the trainable
    leaves|, the norm taken without the frozen ones. (Step 0's rate is the warmup's 0, so the
    second step, from the same params, is the one measured.)"""
    optim = _optim("embedding,attention,untagged", name="optax:sgd", lr=1.0, grad_clip=0.01)
    start, end = _steps(optim, steps=2)

    def mean_cross_entropy(params):
        logits_BxTxV = forward(params, BATCH_BxT1[:, :-1], BASE)
        targets_BxT = BATCH_BxT1[:, 1:]
        return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, targets_BxT).mean()

    grads = _by_path(jax.grad(mean_cross_entropy)(start))
    start, end = _by_path(start), _by_path(end)
    trainable = [p for p in grads if "/mlp/" in p]
    norm = np.sqrt(sum(np.sum(np.square(grads[p])) for p in trainable))
    assert norm > 0.01  # the clip is active
    for path in start:
        if path in trainable:
            want = start[path] - grads[path] * 0.01 / norm
            np.testing.assert_allclose(end[path], want, rtol=1e-5, atol=1e-8, err_msg=path)
        else:
            np.testing.assert_array_equal(end[path], start[path], err_msg=path)


def test_an_unknown_or_malformed_frozen_tag_is_refused():
    with pytest.raises(ValueError, match=r"optim.frozen_tags names \['mpl'\], which no parameter"):
        _steps(_optim("mpl"), steps=0)
    with pytest.raises(ValueError, match=r"'mlp=0' is not a tag name"):
        check_values(Optim, {"frozen_tags": "mlp=0"}, "config.optim")


# ----------------------------------------------------------------------------- the command line


def _doc_commands() -> list[list[str]]:
    """The minigpt-jax commands of docs/extending/model.md's LoRA section, as argument lists."""
    page = (REPO / "docs" / "extending" / "model.md").read_text()
    section = page[page.index("## Adapters for fine-tuning (LoRA)") :]
    block = section[section.index("A run to start from") :].split("```")[1]
    lines = block.replace("\\\n", " ").strip().splitlines()
    return [shlex.split(line) for line in lines]


SHORTER = ["--config.num_steps=4", "--config.eval_every=4", "--config.checkpoint_every=4"]
SHORTER += ["--config.optim.warmup_steps=0", "--progress=false"]


@pytest.mark.slow
def test_the_docs_lora_fine_tunes_a_run_with_its_base_frozen(lora_dir):
    """docs/extending/model.md's commands as written (shorter runs): a run, its LoRA
    fine-tuning from the run directory, then sampling from it."""
    base_run, lora_run, sample = _doc_commands()
    assert [base_run[:2], lora_run[:2], sample[:2]] == [["minigpt-jax", "train"]] * 2 + [
        ["minigpt-jax", "sample"]
    ]
    cli_in(lora_dir, *base_run[1:], *SHORTER)
    tuned = cli_in(lora_dir, *lora_run[1:], *SHORTER)
    assert "8 parameters the checkpoint lacks start from the model's init" in tuned.stderr
    base = _by_path(load_params(lora_dir / "runs/base")[0])
    lora = _by_path(load_params(lora_dir / "runs/lora")[0])
    assert sorted(set(lora) - set(base)) == sorted(ADAPTERS)
    for path, weight in base.items():
        np.testing.assert_array_equal(lora[path], weight, err_msg=path)
    for path in ADAPTERS:
        if path.endswith("/b"):  # B starts at zero, and moved
            assert np.abs(lora[path]).max() > 0, path
    sampled = cli_in(lora_dir, *sample[1:], "--max_new_tokens", "20")
    assert sampled.stdout.startswith("The ") and len(sampled.stdout) > len("The ") + 10
