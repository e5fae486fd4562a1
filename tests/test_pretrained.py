"""Hugging Face GPT-2 checkpoints and tokenizers: a small random GPT2LMHeadModel built with
`transformers` loads with equal logits, exports back unchanged, and bad checkpoints are refused."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import pydoc_text

from minigpt_jax import gpt2 as pretrained
from minigpt_jax import model_files
from minigpt_jax.data.tokenizers import GPT2_EOT, BPETokenizer, load_gpt2_tokenizer
from minigpt_jax.model.gpt import forward, forward_with_cache, init_cache
from minigpt_jax.sampling.api import generate
from minigpt_jax.train.evaluation import perplexity, sliding_windows
from minigpt_jax.typed_config import build_experiment

# The full suite only (`python -m pytest -q`): GPT-2 round trips against transformers.
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")  # the `hf` extra, installed by .ci/run
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
TEXT = pydoc_text(20_000)
VOCAB = 300  # 256 bytes, 43 merges and <|endoftext|>, last as in GPT-2


def _gpt2_tokenizer_files(directory: Path) -> None:
    """A byte-level BPE learned from TEXT, written as GPT-2's vocab.json + merges.txt with
    <|endoftext|> as the last id."""
    bpe = BPETokenizer.train(TEXT, VOCAB - 1)
    bpe._hf.model.save(str(directory))
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    vocab[GPT2_EOT] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random tied GPT-2 (2 layers, D=32, 4 heads, 32 positions) saved by transformers with its
    tokenizer files; every weight, LayerNorms and biases included, drawn away from its init."""
    directory = tmp_path_factory.mktemp("hf_gpt2")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(directory)
    _gpt2_tokenizer_files(directory)
    return directory


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    return transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()


@pytest.fixture(scope="module")
def loaded(hf_dir):
    return model_files.load_model(hf_dir)


def _hf_logits(model, tokens_BxT):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens_BxT), dtype=torch.long)).logits.numpy()


def _tokens(shape, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int32)


# ----------------------------------------------------------------------------- weights


def test_load_gpt2_reads_the_config(loaded):
    cfg = loaded.cfg
    assert (cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd) == (
        VOCAB,
        32,
        2,
        4,
        32,
    )
    assert cfg.gelu_approximate and cfg.tie_embeddings and cfg.use_bias
    assert "lm_head" not in loaded.params
    assert loaded.params["embed"]["tok"]["embedding"].shape == (VOCAB, 32)


def test_logits_equal_transformers_on_a_batch(loaded, hf_model):
    tokens_BxT = _tokens((3, 32))
    ours = np.asarray(forward(loaded.params, tokens_BxT, loaded.cfg))
    np.testing.assert_allclose(ours, _hf_logits(hf_model, tokens_BxT), atol=1e-4, rtol=0)


def test_kv_cache_token_by_token_equals_transformers(loaded, hf_model):
    """One token at a time through the KV cache gives transformers' full-sequence logits."""
    cfg, tokens_BxT = loaded.cfg, _tokens((2, 20), seed=1)
    expected = _hf_logits(hf_model, tokens_BxT)
    cache = init_cache(cfg, 2, 20)
    for t in range(20):
        positions_Bx1 = np.full((2, 1), t, np.int32)
        logits_Bx1xV, cache = forward_with_cache(
            loaded.params, tokens_BxT[:, t : t + 1], positions_Bx1, cache, cfg
        )
        np.testing.assert_allclose(logits_Bx1xV[:, 0], expected[:, t], atol=1e-4, rtol=0)


def test_greedy_generate_equals_transformers_generate(loaded, hf_model):
    prompt_1xT = _tokens((1, 6), seed=2)
    ours, logits = generate(
        loaded.params,
        loaded.cfg,
        prompt_1xT,
        10,
        rng=jax.random.key(0),
        temperature=0.0,
        return_logits=True,
    )
    with torch.no_grad():
        theirs = hf_model.generate(
            torch.as_tensor(prompt_1xT, dtype=torch.long),
            max_new_tokens=10,
            do_sample=False,
            pad_token_id=VOCAB - 1,
            output_logits=True,
            return_dict_in_generate=True,
        )
    np.testing.assert_array_equal(ours, theirs.sequences.numpy())
    hf_step_logits = np.stack([x.numpy() for x in theirs.logits], axis=1)
    np.testing.assert_allclose(logits, hf_step_logits, atol=1e-4, rtol=0)


def test_save_gpt2_reloads_in_transformers_with_identical_logits(loaded, hf_model, tmp_path):
    pretrained.save_gpt2(loaded.params, loaded.cfg, tmp_path, loaded.tokenizer)
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    tokens_BxT = _tokens((2, 32), seed=3)
    np.testing.assert_array_equal(
        _hf_logits(reloaded, tokens_BxT), _hf_logits(hf_model, tokens_BxT)
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "def f(x):\n    return x  # ünïcode ✓" + GPT2_EOT
    assert tokenizer(text)["input_ids"] == loaded.tokenizer.encode(text).tolist()


def test_untied_and_bias_free_models_round_trip(tmp_path):
    """An untied head goes to lm_head.weight; a model without biases exports zero biases."""
    from minigpt_jax.model.config import GPTConfig
    from minigpt_jax.model.gpt import init_params

    cfg = GPTConfig(
        vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16, tie_embeddings=False,
        use_bias=False, gelu_approximate=False,
    )  # fmt: skip
    params = init_params(cfg, jax.random.key(0))
    pretrained.save_gpt2(params, cfg, tmp_path)
    cfg2, params2 = pretrained.load_gpt2(tmp_path)
    assert not cfg2.tie_embeddings and not cfg2.gelu_approximate
    tokens_BxT = _tokens((2, 16)) % 64
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ours = np.asarray(forward(params, tokens_BxT, cfg))
    np.testing.assert_allclose(np.asarray(forward(params2, tokens_BxT, cfg2)), ours, atol=1e-6)
    np.testing.assert_allclose(_hf_logits(hf, tokens_BxT), ours, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_encodes_and_decodes_like_gpt2_tokenizer_fast(hf_dir, tmp_path):
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(hf_dir / name, tmp_path / name)
    ours = load_gpt2_tokenizer(tmp_path)
    theirs = transformers.GPT2TokenizerFast.from_pretrained(tmp_path)
    assert ours.vocab_size == len(theirs) == VOCAB and ours.eot_id == VOCAB - 1
    for text in (
        TEXT[:3000],
        " leading space, trailing space ",
        "tabs\tand\n\nnewlines\r\n",
        "unicode: zażółć gęślą jaźń, 日本語, emoji 🙂👍🏽",
        f"one document{GPT2_EOT}the next",
    ):
        ids = ours.encode(text)
        assert ids.tolist() == theirs(text)["input_ids"], text
        assert ours.decode(ids) == theirs.decode(ids.tolist()) == text


def test_tokenizer_json_is_read_in_preference(hf_dir, tmp_path, loaded):
    loaded.tokenizer.save_gpt2_files(tmp_path)
    (tmp_path / "vocab.json").unlink()
    again = load_gpt2_tokenizer(tmp_path)
    assert again.encode(TEXT[:500]).tolist() == loaded.tokenizer.encode(TEXT[:500]).tolist()


@pytest.mark.parametrize("files", [("vocab.json", "merges.txt"), ("tokenizer.json",)])
def test_add_prefix_space_of_tokenizer_config_is_followed(hf_dir, tmp_path, loaded, files):
    """tokenizer_config.json's add_prefix_space: true (issue: ignored, "Hello world" was
    [15496, 995] in GPT-2's files where transformers gives [18435, 995])."""
    if files == ("tokenizer.json",):
        loaded.tokenizer.save_gpt2_files(tmp_path)
        (tmp_path / "vocab.json").unlink()
    else:
        for name in files:
            shutil.copy(hf_dir / name, tmp_path / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_prefix_space": True}))
    ours = load_gpt2_tokenizer(tmp_path)
    theirs = transformers.GPT2TokenizerFast.from_pretrained(tmp_path)
    for text in ("Hello world", TEXT[:500]):
        assert ours.encode(text).tolist() == theirs(text)["input_ids"], text
    assert ours.encode("Hello world").tolist() != loaded.tokenizer.encode("Hello world").tolist()


# ----------------------------------------------------------------------------- errors


def _copy(hf_dir, tmp_path):
    directory = tmp_path / "ckpt"
    shutil.copytree(hf_dir, directory)
    return directory


def _rewrite_tensors(directory, change):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(directory / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(directory / "model.safetensors"), {"format": "pt"})


def _rewrite_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def test_hub_layout_and_shards_load_the_same_params(hf_dir, loaded, tmp_path):
    """The hub's gpt2 files name tensors without `transformer.` and keep the causal-mask buffers
    `h.{i}.attn.bias`; big models come in shards listed by model.safetensors.index.json."""
    from safetensors.numpy import load_file, save_file

    directory = _copy(hf_dir, tmp_path)
    tensors = {
        name.removeprefix("transformer."): value
        for name, value in load_file(str(directory / "model.safetensors")).items()
    }
    tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
    (directory / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[:10],
        "model-00002-of-00002.safetensors": names[10:],
    }
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(directory / shard), {"format": "pt"})
    weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _, params = pretrained.load_gpt2(directory)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, loaded.params)


def test_nonexistent_path_says_nothing_is_downloaded(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*nothing is downloaded"):
        pretrained.load_gpt2(tmp_path / "gpt2")


def test_missing_tensor_is_named(hf_dir, tmp_path):
    directory = _copy(hf_dir, tmp_path)
    _rewrite_tensors(directory, lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"))
    with pytest.raises(pretrained.GPT2CheckpointError, match=r"'h\.1\.mlp\.c_fc\.bias' is missing"):
        pretrained.load_gpt2(directory)


def test_wrong_shape_is_named(hf_dir, tmp_path):
    directory = _copy(hf_dir, tmp_path)
    _rewrite_config(directory, n_positions=64)
    with pytest.raises(pretrained.GPT2CheckpointError, match=r"'wpe\.weight' has shape \(32, 32\)"):
        pretrained.load_gpt2(directory)


def test_untied_head_under_a_tied_config_is_refused(hf_dir, tmp_path):
    directory = _copy(hf_dir, tmp_path)

    def add_head(tensors):
        tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1.0

    _rewrite_tensors(directory, add_head)
    with pytest.raises(pretrained.GPT2CheckpointError, match="lm_head.weight differs"):
        pretrained.load_gpt2(directory)


def test_other_architecture_is_refused(hf_dir, tmp_path):
    directory = _copy(hf_dir, tmp_path)
    _rewrite_config(directory, model_type="llama")
    with pytest.raises(pretrained.GPT2CheckpointError, match="model_type='llama', not 'gpt2'"):
        pretrained.load_gpt2(directory)
    _rewrite_config(directory, model_type="gpt2", scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(pretrained.GPT2CheckpointError, match="scale_attn_by_inverse_layer_idx"):
        pretrained.load_gpt2(directory)


def test_extra_tensors_and_damaged_files_are_refused(hf_dir, tmp_path):
    directory = _copy(hf_dir, tmp_path)
    _rewrite_config(directory, n_layer=1)
    with pytest.raises(pretrained.GPT2CheckpointError, match=r"tensors \['h\.1\."):
        pretrained.load_gpt2(directory)
    (directory / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(pretrained.GPT2CheckpointError, match="not a readable safetensors"):
        pretrained.load_gpt2(directory)
    (directory / "model.safetensors").unlink()
    with pytest.raises(pretrained.GPT2CheckpointError, match="has no model.safetensors"):
        pretrained.load_gpt2(directory)


def test_fine_tuning_config_must_match_the_checkpoint(loaded):
    with pytest.raises(ValueError, match="n_embd: checkpoint 32, config 64"):
        model_files.params_for(loaded, loaded.cfg.replace(n_embd=64, n_head=4))
    cropped = model_files.params_for(loaded, loaded.cfg.replace(block_size=16, dropout=0.0))
    assert cropped["embed"]["pos"]["embedding"].shape == (16, 32)
    with pytest.raises(ValueError, match="exceeds the checkpoint's learned 32 positions"):
        model_files.params_for(loaded, loaded.cfg.replace(block_size=64))


def test_vocabulary_padding_is_added_for_training_and_dropped_on_export(loaded, tmp_path):
    """params_for pads the table to the config's vocab_multiple (same logits); save_gpt2 writes
    the V real rows only, so the export reloads as the checkpoint it came from."""
    padded_cfg = loaded.cfg.replace(vocab_multiple=64)
    padded = model_files.params_for(loaded, padded_cfg)
    table = padded["embed"]["tok"]["embedding"]
    assert table.shape == (padded_cfg.padded_vocab_size, loaded.cfg.n_embd)
    assert padded_cfg.padded_vocab_size > loaded.cfg.vocab_size
    tokens_BxT = _tokens((2, 16), seed=4)
    np.testing.assert_allclose(
        forward(padded, tokens_BxT, padded_cfg), forward(loaded.params, tokens_BxT, loaded.cfg),
        atol=1e-5, rtol=1e-5,
    )  # fmt: skip
    pretrained.save_gpt2(padded, padded_cfg, tmp_path, loaded.tokenizer)
    _, reloaded = pretrained.load_gpt2(tmp_path)
    np.testing.assert_array_equal(
        reloaded["embed"]["tok"]["embedding"], loaded.params["embed"]["tok"]["embedding"]
    )


# ----------------------------------------------------------------------------- perplexity


def test_sliding_windows_score_every_token_once():
    for n, window, stride in [(2, 4, 4), (10, 4, 4), (10, 4, 1), (33, 8, 3), (9, 8, 8)]:
        scored = []
        for begin, end, first in sliding_windows(n, window, stride):
            assert end - begin <= window and begin < first <= end
            if first > 1:  # every later window gives its targets window - stride of context
                assert first - 1 - begin >= window - stride
            scored += range(first, end + 1)
        assert scored == list(range(1, n)), (n, window, stride)


def test_perplexity_equals_transformers_loss(loaded, hf_model):
    """With stride = window, the loss is transformers' mean loss over the same windows."""
    cfg, tokenizer = loaded.cfg, loaded.tokenizer
    text = TEXT[:1500]
    ids = tokenizer.encode(text)
    result = perplexity(loaded.params, cfg, tokenizer, text, batch_size=4)
    total = 0.0
    for begin, end, _ in sliding_windows(ids.size, 32, 32):
        inputs = torch.as_tensor(ids[begin : end + 1][None], dtype=torch.long)
        with torch.no_grad():
            logits = hf_model(inputs[:, :-1]).logits
        total += torch.nn.functional.cross_entropy(logits[0], inputs[0, 1:], reduction="sum")
    assert result.tokens_scored == ids.size - 1
    np.testing.assert_allclose(result.loss, float(total) / (ids.size - 1), rtol=1e-5)
    np.testing.assert_allclose(result.perplexity, np.exp(result.loss), rtol=1e-12)
    first = len(tokenizer.decode(ids[:1]).encode())
    bits = result.loss * result.tokens_scored / np.log(2)
    np.testing.assert_allclose(result.bits_per_byte, bits / (len(text.encode()) - first))
    overlapped = perplexity(loaded.params, cfg, tokenizer, text, stride=8, batch_size=4)
    assert overlapped.tokens_scored == result.tokens_scored


# ----------------------------------------------------------------------------- command line


def _cli(*args):
    result = subprocess.run(
        [sys.executable, "-m", "minigpt_jax", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    return result


@pytest.mark.slow
def test_cli_sample_train_export_eval_end_to_end(hf_dir, hf_model, tmp_path):
    """sample --pretrained, train --config.init_from, export and eval, in subprocesses."""
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT)
    result = _cli("sample", f"--pretrained={hf_dir}", "--prompt=def ", "--max_new_tokens=8")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("def ")

    run = tmp_path / "run"
    result = _cli(
        "train",
        f"--config={REPO / 'configs' / 'tiny.py'}",
        f"--workdir={run}",
        f"--config.init_from={hf_dir}",
        "--config.data.corpus=text",
        f"--config.data.path={text_file}",
        "--config.model.block_size=16",
        "--config.model.n_head=4",
        "--config.model.gelu_approximate=true",
        "--config.num_steps=10",
        "--config.eval_every=10",
        "--config.checkpoint_every=10",
        "--progress=false",
    )
    assert result.returncode == 0, result.stderr
    assert "step 10:" in result.stdout

    out = tmp_path / "exported"
    result = _cli("export", f"--workdir={run}", f"--out={out}")
    assert result.returncode == 0, result.stderr
    exported = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    tuned = model_files.load_model(run)
    tokens_BxT = _tokens((2, 16), seed=4)
    np.testing.assert_allclose(
        _hf_logits(exported, tokens_BxT),
        np.asarray(forward(tuned.params, tokens_BxT, tuned.cfg)),
        atol=1e-4,
        rtol=0,
    )

    result = _cli("eval", f"--pretrained={out}", f"--text={text_file}", "--stride=8")
    assert result.returncode == 0, result.stderr
    assert "tokens seen" in result.stdout and "perplexity" in result.stdout

    result = _cli("eval", f"--pretrained={tmp_path / 'nowhere'}", f"--text={text_file}")
    assert result.returncode != 0 and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- experiments


def test_embedding_experiments_run_on_a_pretrained_checkpoint(hf_dir, loaded, tmp_path):
    """geometry, tying, lookup and positions study the checkpoint's own tables."""
    from experiments import geometry, lookup, positions, tying

    table_VxD = np.asarray(loaded.params["embed"]["tok"]["embedding"])
    result = geometry.run_pretrained(hf_dir, tmp_path, k=3, max_tokens=200)
    assert result["vocab_size"] == 200 and set(result["neighbours"]) >= {"a", "e", "A"}
    unit_VxD = table_VxD[:200] / np.linalg.norm(table_VxD[:200], axis=1, keepdims=True)
    row = int(loaded.tokenizer.encode("a")[0])
    best = int(np.argsort(-(unit_VxD @ unit_VxD[row]))[1])
    assert result["neighbours"]["a"][0][0] == loaded.tokenizer.decode([best])

    result = tying.run(tmp_path, cfg=loaded.cfg, params=loaded.params, batch=2, length=9)
    assert result["vocab_size"] == VOCAB and result["grad_sum_max_abs_diff"] < 1e-5

    result = lookup.run(tmp_path, tokens=16, repeats=1, table=table_VxD)
    assert [(r["V"], r["D"]) for r in result["costs"]] == [(VOCAB, 32)]

    result = positions.run_learned(hf_dir, tmp_path)
    unit_TxD = np.asarray(loaded.params["embed"]["pos"]["embedding"])
    unit_TxD = unit_TxD / np.linalg.norm(unit_TxD, axis=1, keepdims=True)
    expected = np.mean(np.sum(unit_TxD[:-1] * unit_TxD[1:], axis=1))
    np.testing.assert_allclose(result["cosine_at_offset"][1], expected, rtol=1e-6)
    assert result["refuses_block_size_plus_one"]


# ----------------------------------------------------------------------------- fine-tuning


def _finetune_config(init_from, corpus, **changes):
    from configs import tiny

    config = tiny.get_config()
    config.init_from = str(init_from)
    config.data.corpus, config.data.path = "text", str(corpus)
    config.model.block_size, config.model.n_head = 16, 4
    config.model.gelu_approximate = True
    config.num_steps = config.eval_every = config.checkpoint_every = 2
    config.eval_batches = 1
    for key, value in changes.items():
        config[key] = value
    return config


@pytest.mark.slow
def test_init_from_starts_training_at_the_checkpoint(hf_dir, loaded, tmp_path):
    """With a zero learning rate the run's params stay the checkpoint's (positions cropped to
    the config's block_size), from a Hugging Face directory and from a run directory alike."""
    from minigpt_jax.train.loop import train_and_evaluate

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    config = _finetune_config(hf_dir, corpus)
    config.optim.lr = config.optim.min_lr = config.optim.weight_decay = 0.0
    train_and_evaluate(build_experiment(config), tmp_path / "run", progress=False)
    run = model_files.load_model(tmp_path / "run")
    assert run.tokenizer.to_json() == loaded.tokenizer.to_json()
    expected = model_files.params_for(loaded, run.cfg)
    jax.tree_util.tree_map(np.testing.assert_array_equal, run.params, expected)

    config.init_from = str(tmp_path / "run")
    train_and_evaluate(build_experiment(config), tmp_path / "run2", progress=False)
    again = model_files.load_model(tmp_path / "run2")
    jax.tree_util.tree_map(np.testing.assert_array_equal, again.params, expected)

    config.init_from = str(hf_dir)
    config.model.n_embd, config.model.n_head = 64, 4
    with pytest.raises(ValueError, match="n_embd: checkpoint 32, config 64"):
        train_and_evaluate(build_experiment(config), tmp_path / "run3", progress=False)
