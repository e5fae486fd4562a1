"""Shape schedules (settings.shape_schedule) and the step the model sees (model.step_variable): a
sequence-length or batch-size schedule's first phase trains bit-identically to a fixed run of
that shape, a resume mid-schedule equals the uninterrupted run, a changed schedule is refused on
resume, a bad schedule is one line naming the fix; a step-aware block (docs/extending/model.md's
file) sees the step in training and None outside it, and the docs' command trains with both."""

import importlib
import re
import shlex

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    REPO,
    cli_in,
    error_lines,
    extending_files,
    pydoc_text,
    tiny_config,
    trajectory,
)

from minigpt_jax.config_dict import check_experiment_config
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.gpt import init_params
from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.settings.shape_schedule import ShapeSchedule, parse_step_schedule
from minigpt_jax.train.loop import train_and_evaluate
from minigpt_jax.train.metrics import read_metrics
from minigpt_jax.train.setup import ChunkPerShape, set_up
from minigpt_jax.train.step import loss_fn
from minigpt_jax.typed_config import build_experiment

STEPS = {"num_steps": 12, "steps_per_call": 2, "eval_every": 4, "checkpoint_every": 4}
TRAIN_KEYS = ("train_loss", "grad_norm", "lr")


def _train(corpus_file, workdir, stop_at=None, **overrides):
    config = tiny_config(corpus_file, **{**STEPS, **overrides})
    return train_and_evaluate(build_experiment(config), workdir, progress=False, stop_at=stop_at)


def _train_records(workdir, upto_step):
    return [
        {key: record[key] for key in ("step", *TRAIN_KEYS)}
        for record in read_metrics(workdir, upto_step)
        if "train_loss" in record
    ]


# ---------------------------------------------------------------------------- the parser


def test_a_schedule_gives_each_step_its_value():
    schedule = parse_step_schedule("16:100,32:200", "seq_len_schedule", full=64, steps_per_call=10)
    assert [schedule.at(s) for s in (0, 99, 100, 199, 200, 10**6)] == [16, 16, 32, 32, 64, 64]
    last = parse_step_schedule("16:100,48", "seq_len_schedule", full=64, steps_per_call=10)
    assert [last.at(s) for s in (99, 100, 10**6)] == [16, 48, 48]
    empty = parse_step_schedule("", "seq_len_schedule", full=64, steps_per_call=10)
    assert empty.phases == () and empty.final == 64


def test_the_shapes_a_run_compiles_are_those_its_steps_meet():
    config = check_experiment_config(
        {
            "batch_size": 8,
            "steps_per_call": 2,
            "model": {"block_size": 32},
            "seq_len_schedule": "8:4,16:8",
            "batch_size_schedule": "4:6",
        }
    )
    shapes = ShapeSchedule.of(config)
    assert [shapes.at(s) for s in (0, 3, 4, 5, 6, 7, 8)] == [
        (4, 8), (4, 8), (4, 16), (4, 16), (8, 16), (8, 16), (8, 32),
    ]  # fmt: skip
    assert shapes.first_steps(0, 100) == {(4, 8): 0, (4, 16): 4, (8, 16): 6, (8, 32): 8}
    assert shapes.first_steps(6, 8) == {(8, 16): 6}  # a resume at step 6, stopping at 8
    assert shapes.tokens(2, 4) == 2 * 4 * 8 + 2 * 4 * 16
    assert shapes.fixed is None
    # A bare last value is a schedule with no change: one shape, the plain run's.
    plain = ShapeSchedule.of(
        check_experiment_config(
            {"batch_size": 8, "seq_len_schedule": "16", "model": {"block_size": 32}}
        )
    )
    assert plain.fixed == (8, 16) and plain.tokens(3, 5) == 5 * 8 * 16
    assert plain.first_steps(0, 100) == {(8, 16): 0}
    assert ChunkPerShape.of({(8, 16): len}) is len  # one shape: its compiled chunk itself
    chunks = ChunkPerShape.of({(4, 8): lambda state, b: "4x8", (8, 16): lambda state, b: "8x16"})
    assert isinstance(chunks, ChunkPerShape) and chunks(None, np.zeros((2, 8, 17))) == "8x16"


@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [
        ("seq_len_schedule", "16:8,x", "'x' is not length:until_step"),
        ("seq_len_schedule", "16,8:8", "'16' is not length:until_step (a bare length only last)"),
        ("seq_len_schedule", "8:4;16:8", "'8:4;16:8' is not length:until_step"),
        ("seq_len_schedule", "32:8", "length 32 must be from 1 to model.block_size=16"),
        ("seq_len_schedule", "0:8", "length 0 must be from 1 to model.block_size=16"),
        ("seq_len_schedule", "8:8,12:8", "until_step 8 must be above 8 and a multiple of"),
        ("seq_len_schedule", "8:5", "until_step 5 must be above 0 and a multiple of steps_"),
        ("batch_size_schedule", "3:8", "batch size 3 must be from 1 to batch_size=4 and a mult"),
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_fix(setting, value, words):
    config = tiny_config("corpus.txt", steps_per_call=2, grad_accum_steps=2, **{setting: value})
    with pytest.raises(ValueError) as error:
        check_experiment_config(config)
    message = str(error.value)
    assert message.startswith(f"config.{setting}={value!r}: {words}"), message
    assert "\n" not in message
    assert re.search(r"(write e\.g\.|use a multiple of|change it, or raise) ", message), message


def test_a_bad_schedule_on_the_command_line_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    result = cli_in(
        tmp_path,
        "train",
        "--config",
        "tiny",
        f"--workdir={workdir}",
        "--config.seq_len_schedule=8-4",
        check=False,
    )
    assert result.returncode != 0
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "'8-4' is not length:until_step" in lines[0], result.stderr
    assert not workdir.exists()


# ---------------------------------------------------------------------------- training


@pytest.mark.parametrize(
    ("scheduled", "fixed"),
    [
        ({"seq_len_schedule": "8:4"}, {"model.block_size": 8}),
        ({"batch_size_schedule": "2:4"}, {"batch_size": 2}),
    ],
)
def test_a_schedules_first_phase_is_the_fixed_run_of_its_shape(
    corpus_file, tmp_path, scheduled, fixed
):
    """Steps 1-4 of a run whose first phase is (B, T) = (2, 16) or (4, 8) of the full (4, 16)
    are bit for bit those of a run of that shape throughout (same seed, same num_steps), and
    so are its params after them (the learned position table's first 8 rows: positions past 8
    are not used, so not trained, in either)."""
    _train(corpus_file, tmp_path / "scheduled", stop_at=4, **scheduled)
    _train(corpus_file, tmp_path / "fixed", stop_at=4, **fixed)
    assert _train_records(tmp_path / "scheduled", 4) == _train_records(tmp_path / "fixed", 4)
    assert len(_train_records(tmp_path / "fixed", 4)) == 4
    scheduled_params, _ = load_params(tmp_path / "scheduled", trained=True)
    fixed_params, _ = load_params(tmp_path / "fixed", trained=True)
    position_rows = fixed_params["embed"]["pos"]["embedding"].shape[0]
    table = scheduled_params["embed"]["pos"]["embedding"]
    scheduled_params["embed"]["pos"]["embedding"] = table[:position_rows]
    jax.tree.map(np.testing.assert_array_equal, scheduled_params, fixed_params)


def test_a_resume_mid_schedule_equals_the_uninterrupted_run(corpus_file, tmp_path):
    """Steps 0-3 at length 4, 4-7 at 8, then 16: stopped at step 6 (the second phase) and
    resumed, the record (losses, evaluations at the full length) is the uninterrupted one's."""
    schedule = {"seq_len_schedule": "4:4,8:8", "batch_size_schedule": "2:6"}
    _train(corpus_file, tmp_path / "whole", **schedule)
    _train(corpus_file, tmp_path / "resumed", stop_at=6, **schedule)
    summary = _train(corpus_file, tmp_path / "resumed", **schedule)
    assert summary.resumed_from == 6
    assert trajectory(tmp_path / "resumed") == trajectory(tmp_path / "whole")
    assert sum("val_loss" in record for record in trajectory(tmp_path / "whole")) == 3


def test_each_shape_left_is_compiled_once(corpus_file, tmp_path):
    """A fresh run compiles the three shapes of its schedule before its first step; resumed at
    step 6 (the second phase), the two it has left."""
    schedule = {"seq_len_schedule": "4:4,8:8", "batch_size_schedule": "2:6"}

    def compiled_shapes():
        config = build_experiment(tiny_config(corpus_file, **{**STEPS, **schedule}))
        run = set_up(config, tmp_path)
        run.checkpointer.close()
        return list(run.train_chunk.compiled)

    assert compiled_shapes() == [(2, 4), (2, 8), (4, 8), (4, 16)]
    _train(corpus_file, tmp_path, stop_at=6, **schedule)
    assert compiled_shapes() == [(4, 8), (4, 16)]


def test_a_resume_with_another_schedule_is_refused(corpus_file, tmp_path):
    _train(corpus_file, tmp_path, stop_at=4, seq_len_schedule="4:4,8:8")
    with pytest.raises(ValueError, match=r"seq_len_schedule: '4:4,8:8' -> '8:8'") as error:
        _train(corpus_file, tmp_path, seq_len_schedule="8:8")
    assert "--allow_resume_changes" in str(error.value)


# ---------------------------------------------------------------------------- the step


def test_a_step_aware_block_sees_the_step_in_training_only(tmp_path, monkeypatch):
    """docs/extending/model.md's FadeIn scales its MLP branch by min(1, step / RAMP_STEPS):
    with no step (evaluation) and at RAMP_STEPS it is the built-in pre_ln block exactly; at
    step 0 it is that block with its MLP's output zeroed, and half way with it halved; the same
    under remat."""
    (tmp_path / "my_step_blocks.py").write_text(extending_files()["my_step_blocks.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    ramp = importlib.import_module("my_step_blocks").RAMP_STEPS
    built_in = GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)
    params = init_params(built_in, jax.random.key(0))
    batch_BxT1 = jax.random.randint(jax.random.key(1), (2, 9), 0, 32)

    def loss(cfg, params, step):
        return loss_fn(params, batch_BxT1, cfg, train=False, step=step)[0]

    def scaled_mlp_out(factor):
        def scale(path, leaf):
            names = [getattr(key, "key", "") for key in path]
            return leaf * factor if names[-3:-1] == ["mlp", "proj"] else leaf

        return jax.tree_util.tree_map_with_path(scale, params)

    assert params["block_0"]["mlp"]["proj"]["kernel"].shape == (64, 16)
    for remat in ("none", "full"):
        fade_in = built_in.replace(block="my_step_blocks:FadeIn", remat=remat)
        reference = loss(built_in, params, None)
        assert loss(fade_in, params, None) == reference
        assert loss(fade_in, params, jnp.int32(ramp)) == reference
        assert loss(fade_in, params, jnp.int32(0)) == loss(built_in, scaled_mlp_out(0.0), None)
        assert loss(fade_in, params, jnp.int32(0)) != reference
        half = loss(fade_in, params, jnp.int32(ramp // 2))
        np.testing.assert_allclose(half, loss(built_in, scaled_mlp_out(0.5), None), rtol=1e-6)


def test_a_model_that_reads_no_step_traces_as_before():
    """The step handed to the model adds no operation when nothing reads it: the loss's jaxpr
    with a step is the one without (the default train step's program is unchanged)."""
    cfg = GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)
    params = init_params(cfg, jax.random.key(0))
    batch_BxT1 = jnp.zeros((2, 9), jnp.int32)

    def jaxpr(with_step):
        def f(params, batch, step):
            return loss_fn(params, batch, cfg, train=False, step=step if with_step else None)

        return str(jax.make_jaxpr(f)(params, batch_BxT1, jnp.int32(3)))

    assert jaxpr(True) == jaxpr(False)


def _doc_command() -> list[str]:
    """docs/extending/model.md's ```bash command that trains with the step-aware block."""
    page = (REPO / "docs" / "extending" / "model.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", page, re.S)
    (command,) = [block for block in blocks if "my_step_blocks:FadeIn" in block]
    return shlex.split(command.replace("\\\n", " "))


@pytest.mark.slow  # two runs through the command line
def test_the_docs_warmup_command_trains_as_written(tmp_path):
    """The docs' command, run from a user's folder holding its files: three shapes, each
    compiled once, the steps of the first phase those of a fixed run of that shape, and the
    evaluations at the full length."""
    (tmp_path / "my_step_blocks.py").write_text(extending_files()["my_step_blocks.py"])
    (tmp_path / "corpus.txt").write_text(pydoc_text())
    command = _doc_command()
    assert command[:2] == ["minigpt-jax", "train"]
    cli_in(tmp_path, *command[1:])
    workdir = tmp_path / "runs" / "warmup"
    records = read_metrics(workdir)
    assert [r["step"] for r in records if "val_loss" in r] == [8, 16, 24]
    # The first phase (B, T) = (2, 8) as a run of that shape throughout.
    fixed = [*command[1:], "--workdir=runs/fixed", "--config.batch_size=2"]
    fixed += ["--config.model.block_size=8", "--config.seq_len_schedule="]
    fixed += ["--config.batch_size_schedule="]
    cli_in(tmp_path, *fixed)
    assert _train_records(workdir, 8) == _train_records(tmp_path / "runs" / "fixed", 8)
    assert _train_records(workdir, 9) != _train_records(tmp_path / "runs" / "fixed", 9)
