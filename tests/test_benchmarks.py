"""benchmarks/train_throughput.py: the side-by-side columns do the same work, and every variant
it times is a valid config. (Speed itself is measured by the benchmark, never asserted here.)"""

import math
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the `bench` extra

from benchmarks import train_throughput  # noqa: E402
from minigpt_jax.config import gpt_config_from  # noqa: E402

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_jax_and_torch_columns_train_identically(capsys):
    """Same initial weights, batches, optimizer and schedule: the same loss after every round."""
    train_throughput.main(
        ["--config", str(CONFIGS / "tiny.py"), "--synthetic"]
        + ["--steps", "4", "--rounds", "2", "--warmup", "2"]
    )
    out = capsys.readouterr().out
    assert re.search(r"^jax default +1 ", out, re.M), out
    assert re.search(r"^torch eager +1 ", out, re.M), out
    losses_line = next(line for line in out.splitlines() if line.startswith("train loss"))
    losses = dict(re.findall(r"(jax default|torch eager) (\d+\.\d+)", losses_line))
    assert set(losses) == {"jax default", "torch eager"}, losses_line
    assert float(losses["jax default"]) == pytest.approx(float(losses["torch eager"]), abs=2e-4)


def test_every_variant_is_a_valid_config():
    """--variants only changes keys the config has, to values GPTConfig accepts; "xla_" keys
    become compiler options, not config keys."""
    config = train_throughput.load_config(str(CONFIGS / "shakespeare_char.py"))
    for name, overrides in train_throughput.VARIANTS.items():
        variant, compiler_options = train_throughput.with_overrides(config, overrides)
        gpt_config_from(variant, vocab_size=65)
        assert set(compiler_options) == {k for k in overrides if k.startswith("xla_")}, name
    with pytest.raises(KeyError, match="model.not_a_key"):
        train_throughput.with_overrides(config, {"model.not_a_key": 1})


def test_gpu_mfu_smoke_preset_runs_on_cpu():
    """benchmarks/gpu_mfu.py's measurement, on its CPU-sized preset (bf16 compute): it trains
    (a finite loss near log V at init) and its figures agree with each other."""
    from benchmarks import gpu_mfu

    preset = gpu_mfu.PRESETS["smoke"]
    cfg, batch_size = preset["cfg"], preset["batch_size"]
    result = gpu_mfu.measure(cfg, batch_size, steps=3, steps_per_call=2, peak_flops=1e12)
    assert abs(result["final_loss"] - math.log(cfg.vocab_size)) < 1.0, result
    tokens = batch_size * cfg.block_size
    assert result["tokens_per_s"] * result["ms_median"] / 1e3 == pytest.approx(tokens)
    assert result["mfu"] == pytest.approx(result["tflops"])  # against a 1 TFLOP/s peak
    assert result["ms_p10"] <= result["ms_median"] <= result["ms_p90"]
