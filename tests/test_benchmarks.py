"""benchmarks/train_throughput.py: the side-by-side columns do the same work, and every variant
it times is a valid config. (Speed itself is measured by the benchmark, never asserted here.)"""

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
