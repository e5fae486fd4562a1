"""benchmarks/train_throughput.py: the side-by-side columns do the same work, and every variant
it times is a valid config. (Speed itself is measured by the benchmark, never asserted here.)"""

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")  # the `bench` extra

from benchmarks import train_throughput  # noqa: E402
from minigpt_jax.config_dict import gpt_config_from, load_config_file  # noqa: E402
from minigpt_jax.model.config import GPTConfig  # noqa: E402
from minigpt_jax.model.speed import backend  # noqa: E402

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_side_by_side_prints_the_table_and_the_loss_check(capsys):
    train_throughput.main(
        ["--config", str(CONFIGS / "tiny.py"), "--synthetic"]
        + ["--steps", "2", "--rounds", "2", "--warmup", "1"]
    )
    out = capsys.readouterr().out
    # The training step's "auto" on this CPU, and beside it in every run the other dtype.
    picked = backend.matmul_dtype(backend.for_training(GPTConfig()))
    other, column = (
        ("float32", "jax default, float32 matmuls")
        if picked == "bfloat16"
        else ("bfloat16", "jax default, bf16 matmuls")
    )
    assert re.search(rf"^jax default +1 .* matmul={picked} ", out, re.M), out
    assert re.search(rf"^{column} +1 .* matmul={other}", out, re.M), out
    assert re.search(r"^torch eager +1 ", out, re.M), out
    assert re.search(rf"over all 5 steps: jax default \d\.\de-\d+, {column} ", out), out
    # Each column's largest loss difference from the reference: within bf16 rounding.
    diffs = re.search(rf"jax default (\S+), {column} (\S+), torch eager 0\.0e\+00", out)
    assert diffs and max(float(diffs[1]), float(diffs[2])) < 1e-2, out


@pytest.mark.parametrize(
    "overrides",
    [{}, {"steps_per_call": 2, "model.gelu_approximate": True, "model.dense_grad": "direct"}],
    ids=["tiny", "shakespeare_char_speed_settings"],
)
def test_jax_and_torch_columns_train_identically(overrides):
    """Same initial weights, batches, optimizer and schedule: the same loss after every step,
    with the settings the shakespeare_char default runs (scan, tanh GELU, direct Dense VJP)."""
    # float32 matmuls on every CPU: the claim is float32 identity (bf16's is the test above).
    config, options = train_throughput.with_overrides(
        load_config_file(str(CONFIGS / "tiny.py")), {**overrides, "model.matmul_dtype": "float32"}
    )
    batches = np.random.default_rng(0).integers(0, 65, (6, 4, config.model.block_size + 1))
    jax_side = train_throughput.jax_column("jax", config, 65, batches.astype(np.int32), options)
    torch_side = train_throughput.torch_column(
        "torch", config, 65, batches, compile_=False, autocast=False
    )
    for column in (jax_side, torch_side):
        column.run(0, 6)
    np.testing.assert_allclose(jax_side.losses, torch_side.losses, rtol=0, atol=1e-4)
    assert jax_side.losses[-1] < jax_side.losses[0]


def test_every_variant_is_a_valid_config():
    """--variants only changes keys the config has, to values GPTConfig accepts; "xla_" keys
    become compiler options, not config keys."""
    config = load_config_file(str(CONFIGS / "shakespeare_char.py"))
    for name, overrides in train_throughput.VARIANTS.items():
        variant, compiler_options = train_throughput.with_overrides(config, overrides)
        gpt_config_from(variant, vocab_size=65)
        assert set(compiler_options) == {k for k in overrides if k.startswith("xla_")}, name
    with pytest.raises(KeyError, match="model.not_a_key"):
        train_throughput.with_overrides(config, {"model.not_a_key": 1})


def test_gpu_mfu_smoke_preset_runs_on_cpu(capsys):
    """benchmarks/gpu_mfu.py side by side on its CPU-sized preset (bf16 compute, padded
    vocabulary): both columns train the same steps on the same batches to the same loss (near
    log V at init), and each column's figures agree with each other."""
    from benchmarks import gpu_mfu

    results = gpu_mfu.main(["--preset", "smoke", "--steps", "2", "--rounds", "2"])
    out = capsys.readouterr().out
    assert re.search(r"^jax default +4 ", out, re.M), out
    assert re.search(r"^torch eager +4 ", out, re.M), out
    match = re.search(r"loss after 6 steps: (\d\.\d+) .*torch eager (\S+)", out)
    assert match, out
    cfg = gpu_mfu.PRESETS["smoke"]["cfg"]
    assert abs(float(match[1]) - math.log(cfg.vocab_size)) < 1.0, out
    assert float(match[2]) < 1e-2, out  # bf16 on both sides
    tokens = 4 * cfg.block_size
    for result in results.values():
        assert result["tokens_per_s"] * result["ms_median"] / 1e3 == pytest.approx(tokens)
        assert result["ms_p10"] <= result["ms_median"] <= result["ms_p90"]
    figures = gpu_mfu.summarize([0.5, 0.25, 1.0], tokens_per_step=1000, flops=1e9, peak_flops=4e12)
    assert figures["tokens_per_s"] == pytest.approx(2000)
    assert figures["tflops"] == pytest.approx(2.0) and figures["mfu"] == pytest.approx(0.5)


def test_data_prep_prints_prepare_and_naive_rows(capsys):
    """benchmarks/data_prep.py on a 2 MB corpus, char tokenizer, no training run."""
    from benchmarks import data_prep

    data_prep.main(
        ["--size-gb", "0.002", "--files", "4", "--naive-mb", "1", "--tokenizers", "char"]
        + ["--no-train"]
    )
    out = capsys.readouterr().out
    assert re.search(r"^prepare --tokenizer char +2 MB .* [\d,]+ MB$", out, re.M), out
    assert re.search(r"^naive \(memory\) --tokenizer char +1 MB", out, re.M), out
    assert re.search(r"^prepare \(same files\) char +1 MB", out, re.M), out


def test_every_gpu_mfu_variant_is_a_valid_setting():
    """--variants only sets GPTConfig fields to values GPTConfig accepts, run keys, and "xla_"
    compiler options."""
    from benchmarks import gpu_mfu

    cfg = gpu_mfu.PRESETS["gpt2_small"]["cfg"]
    for name, overrides in gpu_mfu.VARIANTS.items():
        fields, run, options = gpu_mfu.split_overrides(overrides)
        assert len(fields) + len(run) + len(options) == len(overrides), name
        variant = cfg.replace(**fields)  # raises on an unknown field or a refused value
        assert all(getattr(variant, k) == v for k, v in fields.items()), name
        assert all(k.startswith("xla_gpu_") for k in options), name


def test_gpu_mfu_variants_by_name(capsys):
    """--variants alone times every entry, --variants NAME... those, an unknown name is refused
    with the names there are."""
    import argparse

    from benchmarks import gpu_mfu

    parser = argparse.ArgumentParser()
    assert gpu_mfu.chosen_variants(None, parser) == {}
    assert list(gpu_mfu.chosen_variants([], parser)) == list(gpu_mfu.VARIANTS)
    chosen = gpu_mfu.chosen_variants(["remat dots", "batch 32"], parser)
    assert chosen == {"remat dots": {"remat": "dots"}, "batch 32": {"batch_size": 32}}
    with pytest.raises(SystemExit):
        gpu_mfu.chosen_variants(["remat dot"], parser)
    err = capsys.readouterr().err
    assert "unknown --variants ['remat dot']" in err and "remat dots" in err, err


def test_the_text_memory_budget_covers_the_measured_peak():
    """benchmarks/corpus_memory.py on a 4 MB text, char tokenizer: the budget's bytes a byte
    are at least what the in-memory path takes (issue 40: it assumed 12, measured 26)."""
    from benchmarks import corpus_memory
    from minigpt_jax.budget import TEXT_BYTES_PER_BYTE

    (row,) = corpus_memory.main(["--sizes-mb", "4", "--tokenizers", "char"])
    assert 10 < row["per_byte"] <= TEXT_BYTES_PER_BYTE["char"], row


def test_the_step_account_puts_each_hlo_op_in_its_category():
    """benchmarks/step_account.py: a dot (or a fusion calling one) is a matmul; otherwise the
    flax module in the op_name decides; ops outside the model's jvp are the optimizer's."""
    import jax
    import jax.numpy as jnp

    from benchmarks import step_account as account

    compiled = jax.jit(lambda a, b: jnp.tanh(a @ b) * 2.0).lower(jnp.ones((8, 8)), jnp.ones((8, 8)))
    instructions = account.hlo_instructions(compiled.compile().as_text())
    dots = [name for name, (_, dot) in instructions.items() if dot]
    assert dots and all(not dot for name, (_, dot) in instructions.items() if "tanh" in name)
    path = "jit(train_chunk)/while/body/closed_call/"
    assert account.xla_category(path + "jvp(GPT.hidden)/block_0/attn/attn._attend/div", False) == (
        account.ATTENTION
    )
    assert account.xla_category(path + "transpose(jvp(GPT.hidden))/block_1/mlp/mul", False) == (
        account.ACTIVATION
    )
    assert account.xla_category(path + "jvp(GPT.hidden)/block_0/ln_1/mul", False) == account.NORMS
    assert account.xla_category(path + "jvp(GPT.hidden)/ln_f/add", False) == account.NORMS
    assert account.xla_category(path + "jvp(jit(take_along_axis))/select_n", False) == (
        account.EMBED_LOSS
    )
    assert account.xla_category(path + "sqrt", False) == account.OPTIMIZER
    assert account.xla_category(path + "jvp(GPT.hidden)/block_0/mlp/dot_general", True) == (
        account.MATMUL
    )
    assert account.xla_category(path + "dot_general", True) == account.OPTIMIZER  # Muon's
    assert account.torch_category("aten::mm", False) == account.MATMUL
    assert account.torch_category("aten::native_layer_norm_backward", False) == account.NORMS
    assert account.torch_category("aten::mul_", True) == account.OPTIMIZER
    # 10 steps, 30 ms of ops over a 5 ms wall per step: 3 ms of ops a step, 2 ms the host's.
    step = account.per_step({account.MATMUL: 20.0, account.NORMS: 10.0}, 5.0, 10)
    assert step[account.MATMUL] == pytest.approx(2.0) and step[account.HOST] == pytest.approx(2.0)


def test_the_gpu_check_script_parses_and_names_test_files_that_exist():
    """benchmarks/gpu_check.sh runs on a GPU loan only: here, bash reads it without error and
    every test file it names is there (a renamed file would be missed on the GPU)."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    named = re.findall(r"tests/(test_\w+\.py)", script.read_text())
    assert len(named) >= 10 and "test_gpu.py" in named, named
    missing = [name for name in named if not (script.parent.parent / "tests" / name).exists()]
    assert not missing, missing
