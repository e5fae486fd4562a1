"""The time-to-loss benchmark's evaluation and report, the sweep tool and the ablation table."""

import json

import jax
import numpy as np
import pytest

from benchmarks.time_to_loss import first_at_or_below, make_val_loss, report
from configs import speedrun_char
from experiments import speedrun_ablation, sweep
from minigpt_jax import GPTConfig, forward, init_params
from minigpt_jax.run_config import check_experiment_config


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


def test_sweep_parses_values_and_samples_the_grid():
    assert sweep.parse_values("optim.lr=1e-3,2e-3") == ("optim.lr", [0.001, 0.002])
    assert sweep.parse_values("model.norm=rmsnorm,layernorm")[1] == ["rmsnorm", "layernorm"]
    grid = {"a": [1, 2, 3], "b": [True, False]}
    assert len(sweep.trials(grid, None, 0)) == 6
    sample = sweep.trials(grid, 3, seed=1)
    assert len(sample) == 3 and len({sweep.trial_name(t) for t in sample}) == 3
    assert sample == sweep.trials(grid, 3, seed=1)
    with pytest.raises(ValueError, match="key=value"):
        sweep.parse_values("optim.lr")


@pytest.mark.slow
def test_sweep_runs_a_grid_resumably(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 300)
    out = tmp_path / "sweep"
    args = [
        "--config", "configs/tiny.py", "--out", str(out),
        "--grid", "optim.lr=0.003,0.03",
        "--set", "num_steps=4", "--set", "eval_every=4", "--set", "checkpoint_every=4",
        "--set", "data.corpus=text", "--set", f"data.path={corpus}", "--target", "10.0",
    ]  # fmt: skip
    sweep.main(args)
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["optim.lr"] for r in results] == [0.003, 0.03]
    assert all(r["steps_to_target"] == 4 and r["best_val_loss"] < 10 for r in results)
    assert (out / "results.csv").read_text().count("\n") == 3 and (out / "results.png").exists()
    sweep.main(args)  # a rerun finds every trial done
    assert len((out / "results.jsonl").read_text().splitlines()) == 2


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
