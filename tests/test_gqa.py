"""Grouped-query and multi-query attention (`model.n_kv_head`): G key/value heads equal the
built-in attention whose k and v heads are copied within each group of query heads; the KV cache
holds G heads and decodes as the full forward does; the rule n_head % n_kv_head == 0 is checked
where the setting is declared, before anything runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import decoded_one_token_at_a_time

from minigpt_jax import GPTConfig, SampleSettings, forward, generate, init_params
from minigpt_jax.model.attention import KVCache, expand_kv_heads
from minigpt_jax.model.gpt import init_cache

CFG = GPTConfig(vocab_size=40, block_size=12, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
TOKENS_BxT = jax.random.randint(jax.random.key(3), (2, 9), 0, CFG.vocab_size)


def _as_full_attention(gqa_params, groups: int, n_head: int):
    """The built-in attention's params holding the same function as `gqa_params`: the fused
    (D, 3, H, K) qkv with q as it is and each of the G k/v heads copied into its H / G query
    heads (head h reads kv head h // (H / G)), written out with numpy."""

    def convert(block):
        attn = dict(block["attn"])
        q, kv = attn.pop("q"), attn.pop("kv")
        copies = n_head // groups
        kernel_k = np.repeat(np.asarray(kv["kernel"])[:, 0], copies, axis=1)  # (D, H, K)
        kernel_v = np.repeat(np.asarray(kv["kernel"])[:, 1], copies, axis=1)
        bias_k = np.repeat(np.asarray(kv["bias"])[0], copies, axis=0)  # (H, K)
        bias_v = np.repeat(np.asarray(kv["bias"])[1], copies, axis=0)
        attn["qkv"] = {
            "kernel": np.stack([np.asarray(q["kernel"]), kernel_k, kernel_v], axis=1),
            "bias": np.stack([np.asarray(q["bias"]), bias_k, bias_v], axis=0),
        }
        return {**block, "attn": attn}

    return {
        name: convert(value) if name.startswith("block_") else value
        for name, value in gqa_params.items()
    }


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("attention", ["explicit", "xla"])
def test_grouped_heads_equal_full_attention_with_copied_kv_heads(groups, attention):
    gqa_cfg = CFG.replace(n_kv_head=groups, attention=attention)
    gqa_params = init_params(gqa_cfg, jax.random.key(0))
    attn = gqa_params["block_0"]["attn"]
    assert attn["q"]["kernel"].shape == (32, 4, 8)
    assert attn["kv"]["kernel"].shape == (32, 2, groups, 8)
    full_params = _as_full_attention(gqa_params, groups, CFG.n_head)
    expected = forward(full_params, TOKENS_BxT, CFG.replace(attention=attention))
    got = forward(gqa_params, TOKENS_BxT, gqa_cfg)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_n_kv_head_equal_to_n_head_is_the_built_in_attention():
    params = init_params(CFG, jax.random.key(0))
    assert set(params["block_0"]["attn"]) == {"qkv", "proj"}  # GPT-2's fused c_attn
    same = forward(params, TOKENS_BxT, CFG.replace(n_kv_head=CFG.n_head))
    np.testing.assert_array_equal(same, forward(params, TOKENS_BxT, CFG))


@pytest.mark.parametrize("groups", [1, 2])
def test_the_cache_holds_g_heads_and_decodes_as_the_full_forward(groups):
    cfg = CFG.replace(n_kv_head=groups, pos_encoding="rope", qk_norm=True)
    params = init_params(cfg, jax.random.key(1))
    full_BxTxV = forward(params, TOKENS_BxT, cfg)
    cache = init_cache(cfg, 2, TOKENS_BxT.shape[1])
    assert cache[0].k_BxSxGxK.shape == (2, TOKENS_BxT.shape[1], groups, cfg.head_dim)
    decoded_BxTxV = decoded_one_token_at_a_time(params, TOKENS_BxT, cfg)
    np.testing.assert_allclose(decoded_BxTxV, full_BxTxV, rtol=1e-4, atol=1e-5)


def test_generate_on_the_grouped_cache_is_the_full_attentions_greedy_text():
    cfg = CFG.replace(n_kv_head=2)
    # 4x the init, so greedy picks are far from ties; LayerNorm scales stay 1
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x if path[-1].key == "scale" else 4 * x,
        init_params(cfg, jax.random.key(2)),
    )
    prompts = [[1, 2, 3], [4, 5]]
    kwargs = dict(rng=jax.random.key(0), settings=SampleSettings(temperature=0.0))
    grouped = generate(params, cfg, prompts, 8, **kwargs)
    full = generate(_as_full_attention(params, 2, CFG.n_head), CFG, prompts, 8, **kwargs)
    assert [list(map(int, row)) for row in grouped] == [list(map(int, row)) for row in full]
    assert [len(row) for row in grouped] == [11, 10]


def test_cache_write_and_expand_are_the_documented_layout():
    cfg = CFG.replace(n_kv_head=2)
    cache = KVCache.empty(cfg, batch=1, length=4)
    k_1x2xGxK = jnp.arange(2 * 2 * 8, dtype=jnp.float32).reshape(1, 2, 2, 8)
    cache = cache.write(k_1x2xGxK, -k_1x2xGxK, jnp.array([[5, 6]]))
    assert int(cache.index) == 2
    np.testing.assert_array_equal(cache.positions_BxS, [[5, 6, -1, -1]])
    np.testing.assert_array_equal(cache.k_BxSxGxK[:, :2], k_1x2xGxK)
    wide_1x4x4xK = expand_kv_heads(cache.k_BxSxGxK, 4)
    # query heads 0, 1 read kv head 0; heads 2, 3 read kv head 1
    for h, g in enumerate([0, 0, 1, 1]):
        np.testing.assert_array_equal(wide_1x4x4xK[:, :, h], cache.k_BxSxGxK[:, :, g])
    with pytest.raises(AssertionError):  # H heads into a G-head cache
        cache.write(jnp.zeros((1, 1, 4, 8)), jnp.zeros((1, 1, 4, 8)), jnp.array([[7]]))


def test_n_kv_head_that_does_not_divide_n_head_is_refused_naming_the_divisors():
    with pytest.raises(ValueError) as error:
        CFG.replace(n_kv_head=3)
    assert str(error.value) == (
        "GPTConfig.n_kv_head=3 does not divide n_head=4: each key/value head serves "
        "n_head / n_kv_head query heads; use 0 (one per query head) or one of [1, 2, 4]."
    )


@pytest.mark.slow
def test_the_command_line_trains_and_samples_a_multi_query_model_with_muon(tmp_path, corpus_file):
    """`--config.model.n_kv_head=1` end to end: Muon reads the q and kv kernels as matrices,
    the run saves and samples through a one-head cache; a value that does not divide n_head is
    one line before anything is written."""
    import sys

    from helpers import run, train_args

    workdir = tmp_path / "mqa"
    settings = ["--config.model.n_kv_head=1", "--config.optim.name=muon", "--config.num_steps=6"]
    result = run(train_args(workdir, corpus_file, *settings))
    assert result.returncode == 0, result.stderr
    sample = [sys.executable, "-m", "minigpt_jax", "sample", "--workdir", str(workdir)]
    result = run([*sample, "--prompt=The ", "--max_new_tokens=12"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("The ") and len(result.stdout) == len("The ") + 12 + 1

    refused = tmp_path / "refused"
    result = run(train_args(refused, corpus_file, "--config.model.n_kv_head=3"))
    assert result.returncode == 1
    assert "n_kv_head=3 does not divide n_head=2" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not refused.exists()
