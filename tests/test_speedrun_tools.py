"""The time-to-loss benchmark's evaluation and report and the ablation table (the sweep tool
is tests/test_sweep.py's)."""

from pathlib import Path

import jax
import numpy as np
import pytest

from benchmarks.time_to_loss import first_at_or_below, make_val_loss, report, run_jax
from configs import speedrun_char
from experiments import speedrun_ablation
from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.config_dict import check_experiment_config

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # the track's text


def test_val_loss_scores_every_position_of_non_overlapping_windows():
    cfg = GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    params = init_params(cfg, jax.random.key(0))
    val = np.arange(30) % 11  # 29 targets: 7 windows of 4 inputs (+1 target), 1 token left
    expected = []
    for i in range(7):
        window = val[i * 4 : i * 4 + 5]
        logits = forward(params, window[None, :-1], cfg)[0]
        log_p = jax.nn.log_softmax(logits)
        expected += [-float(log_p[t, window[t + 1]]) for t in range(4)]
    np.testing.assert_allclose(make_val_loss(cfg, val)(params), np.mean(expected), rtol=1e-5)


def _records(pairs):
    return [{"step": s, "tokens": s * 10, "seconds": float(s), "val_loss": v} for s, v in pairs]


def test_report_times_each_contestant_to_the_twins_final_loss():
    runs = {
        "twin": [_records([(100, 2.5), (200, 2.0), (300, 1.9)])],
        "speedrun": [_records([(50, 2.2), (100, 1.85), (150, 1.7)])],
        "course": [_records([(100, 2.6), (200, 2.1)])],
    }
    assert first_at_or_below(runs["speedrun"][0], 1.9)["step"] == 100
    lines = report(runs)
    assert "1.9000" in lines[0]
    speedrun = next(line for line in lines if line.startswith("speedrun"))
    assert speedrun.split()[-1] == "0.33"  # 100 s against the twin's 300 s
    assert "not reached" in next(line for line in lines if line.startswith("course"))


def test_speedrun_config_follows_the_tracks_rules():
    config = check_experiment_config(speedrun_char.get_config())
    assert config.model.block_size == 64
    assert (config.data.corpus, config.data.tokenizer, config.data.val_fraction) == (
        "shakespeare",
        "char",
        0.1,
    )


def test_ablation_table_gives_seconds_steps_and_ratio():
    reference = {"seconds": 40.0, "steps": 400, "last_step": 400, "last_val_loss": 1.87}
    slower = {"seconds": 60.0, "steps": 550, "last_step": 550, "last_val_loss": 1.87}
    missed = {"seconds": None, "steps": None, "last_step": 600, "last_val_loss": 1.95}
    lines = speedrun_ablation.table(
        [("all", reference), ("− Muon", slower), ("− RoPE", missed)], reference
    )
    assert lines[2] == "| all | 40.0 | 400 | 1.00 |"
    assert lines[3] == "| − Muon | 60.0 | 550 | 1.50 |"
    assert "not reached (1.950 at step 600)" in lines[4]


@pytest.mark.slow
@pytest.mark.skipif(
    not (SHARED_DATA / "tinyshakespeare.txt").is_file(), reason=f"{SHARED_DATA} not present"
)
def test_near_the_target_each_chunk_is_evaluated():
    """Once an evaluation reads at most fine_below, the contestant is evaluated after every
    chunk (so its crossing is timed to the chunk); otherwise every eval_every steps."""
    tiny = {
        "num_steps": 40,
        "steps_per_call": 10,
        "batch_size": 4,
        "model.n_layer": 1,
        "model.n_head": 2,
        "model.n_embd": 32,
    }
    steps = {}
    for fine_below in (None, float("inf")):
        records = run_jax("speedrun", str(SHARED_DATA), 20, tiny, fine_below=fine_below)
        steps[fine_below] = [record["step"] for record in records]
        assert all(np.isfinite(record["val_loss"]) for record in records)
    assert steps[None] == [20, 40]
    assert steps[float("inf")] == [20, 30, 40]  # fine from the first evaluation on
