"""Document packing: with `model.attention_mask=document`, documents packed into one row (each
closed by the end-of-text id, the vocabulary's last) are computed exactly as separate
sequences: attention stays inside each, positions restart at each, and no loss crosses a
boundary; the data path puts end-of-text after every document in memory (as shards always do);
KV-cache sampling of one document is the causal model's."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.data.in_memory import prepare_dataset
from minigpt_jax.data.tokenizers import CharTokenizer
from minigpt_jax.model.gpt import document_layout, forward_with_cache, init_cache
from minigpt_jax.train.step import loss_fn

CFG = GPTConfig(
    vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
    attention_mask="document",
)  # fmt: skip
EOT = CFG.vocab_size - 1
DOC_A, DOC_B = [3, 4, 5, 6], [7, 8, 9, 10, 11]
ROW_1xT = jnp.array([DOC_A + [EOT] + DOC_B])  # a closed document, then an open one


def test_document_layout_counts_end_of_text_before_each_token():
    segments, positions = document_layout(jnp.array([[EOT, 1, 2, EOT, EOT, 5, 6]]), CFG)
    assert segments.tolist() == [[0, 1, 1, 1, 2, 3, 3]]
    assert positions.tolist() == [[0, 0, 1, 2, 0, 0, 1]]


@pytest.mark.parametrize("pos_encoding", ["learned", "rope", "sinusoidal"])
@pytest.mark.parametrize("attention", ["explicit", "xla"])
def test_packed_documents_are_computed_as_separate_sequences(pos_encoding, attention):
    cfg = CFG.replace(pos_encoding=pos_encoding, attention=attention)
    alone = cfg.replace(attention_mask="causal")
    params = init_params(cfg, jax.random.key(0))
    packed = forward(params, ROW_1xT, cfg)
    first = forward(params, jnp.array([DOC_A + [EOT]]), alone)
    second = forward(params, jnp.array([DOC_B]), alone)
    np.testing.assert_allclose(packed[:, :5], first, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(packed[:, 5:], second, rtol=1e-5, atol=1e-6)
    # the causal model lets the second document see the first: not the same numbers
    assert not np.allclose(forward(params, ROW_1xT, alone)[:, 5:], second, atol=1e-4)


def test_the_loss_leaves_out_the_target_across_the_boundary():
    params = init_params(CFG, jax.random.key(1))
    alone = CFG.replace(attention_mask="causal")
    objective, _ = loss_fn(params, ROW_1xT, CFG, train=False)
    # separately: A's inputs predict A's next tokens and its end-of-text, B's predict B's own;
    # the target after the end-of-text (B's first token) belongs to no document's context.
    seq_a, seq_b = jnp.array([DOC_A + [EOT]]), jnp.array([DOC_B])
    losses = []
    for seq in (seq_a, seq_b):
        logits = forward(params, seq[:, :-1], alone)
        logp = jax.nn.log_softmax(logits, axis=-1)
        losses += list(
            -np.take_along_axis(np.asarray(logp), np.asarray(seq[:, 1:, None]), -1).ravel()
        )
    assert len(losses) == 8
    np.testing.assert_allclose(objective, np.mean(losses), rtol=1e-5)


def test_a_cached_sample_of_one_document_is_the_causal_models():
    params = init_params(CFG, jax.random.key(2))
    tokens_1xT = jnp.array([DOC_B + [1, 2]])
    causal = forward(params, tokens_1xT, CFG.replace(attention_mask="causal"))
    cache, steps = init_cache(CFG, 1, tokens_1xT.shape[1]), []
    for t in range(tokens_1xT.shape[1]):
        logits, cache = forward_with_cache(
            params, tokens_1xT[:, t : t + 1], jnp.full((1, 1), t), cache, CFG
        )
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), causal, rtol=1e-4, atol=1e-5)


def test_in_memory_documents_end_with_end_of_text_and_plain_runs_are_unchanged(tmp_path):
    docs = ["first doc", "second", "third one"]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs) * 20)
    packed = prepare_dataset("text", path, "char", 0, 4, None, 0.1, documents=True)
    tokenizer = packed.tokenizer
    assert tokenizer.eot_id == tokenizer.vocab_size - 1
    expected = [i for d in docs * 20 for i in [*tokenizer.encode(d), tokenizer.eot_id]]
    np.testing.assert_array_equal(np.concatenate([packed.train, packed.val]), expected)
    plain = prepare_dataset("text", path, "char", 0, 4, None, 0.1)
    joined = CharTokenizer.from_text("\n".join(docs * 20)).encode("\n".join(docs * 20))
    np.testing.assert_array_equal(np.concatenate([plain.train, plain.val]), joined)


@pytest.mark.slow
@pytest.mark.parametrize("data_format", ["memory", "shards"])
def test_the_command_line_trains_resumes_and_samples_packed_documents(
    tmp_path, corpus_file, data_format
):
    import sys

    from helpers import pydoc_text, run, train_args

    text = pydoc_text()
    path = tmp_path / "docs.jsonl"
    path.write_text(
        "".join(json.dumps({"text": text[i : i + 700]}) + "\n" for i in range(0, len(text), 700))
    )
    workdir = tmp_path / "run"
    settings = [
        "--config.model.attention_mask=document",
        f"--config.data.format={data_format}",
        "--config.eval_every=4",
        "--config.checkpoint_every=4",
    ]
    result = run(train_args(workdir, path, *settings, "--config.num_steps=4"))
    assert result.returncode == 0, result.stderr
    result = run(train_args(workdir, path, *settings, "--config.num_steps=8"))
    assert result.returncode == 0, result.stderr
    assert "resumed from step 4" in result.stdout + result.stderr
    sample = [sys.executable, "-m", "minigpt_jax", "sample", "--workdir", str(workdir)]
    result = run([*sample, "--prompt=The ", "--max_new_tokens=8"])
    assert result.returncode == 0 and result.stdout.startswith("The "), result.stderr


def test_a_prompt_holding_end_of_text_warns_that_sampling_crosses_it(caplog):
    """The KV cache continues one document: a prompt with an end-of-text id in it gets one
    warning line naming the problem and the fix; one without gets none."""
    from minigpt_jax.sampling.api import generate

    params = init_params(CFG, jax.random.key(0))
    with caplog.at_level("WARNING", logger="minigpt_jax.sampling.api"):
        generate(params, CFG, [np.array(DOC_A)], 2, rng=jax.random.key(1))
    assert not caplog.records
    with caplog.at_level("WARNING", logger="minigpt_jax.sampling.api"):
        generate(params, CFG, [np.array(DOC_A + [EOT] + DOC_B)], 2, rng=jax.random.key(1))
    (record,) = caplog.records
    message = record.getMessage()
    assert "\n" not in message
    assert message.startswith(f"the prompt holds the end-of-text id {EOT}, but sampling")
    assert "give only the text after the last end-of-text as the prompt" in message
    caplog.clear()
    with caplog.at_level("WARNING", logger="minigpt_jax.sampling.api"):
        generate(
            params,
            CFG.replace(attention_mask="causal"),
            [np.array(DOC_A + [EOT])],
            2,
            rng=jax.random.key(1),
        )
    assert not caplog.records  # a causal model was trained across documents
