"""Plug-ins that hang, exit or lie (issue 57), each through the command line with a plug-in file
of its own outside the package: a step metric may not log a key of the run's own record; a
hook's sys.exit(), Ctrl-C, non-bool answer or hang loses no trained step and ends non-zero with
a line naming it; an early stop says how to go on; the samples prompt is checked before
training. Every run that trains here leaves a metrics.jsonl of the step's own keys only."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    REPO,
    assert_one_plugin_error,
    cli_in,
    error_lines,
    pydoc_text,
    steps,
    write_module,
)

from minigpt_jax.data.tokenizers import GPT2_EOT, load_tokenizer
from minigpt_jax.train.metrics import read_metrics

pytestmark = pytest.mark.slow  # trainings through the CLI

TINY = str(REPO / "configs" / "tiny.py")
# 20 steps, checkpoints every 10 (the probe), one evaluation at the end.
SETTINGS = {
    "data.corpus": "text",
    "data.path": "corpus.txt",
    "num_steps": 20,
    "steps_per_call": 1,
    "eval_every": 20,
    "checkpoint_every": 10,
    "eval_batches": 1,
}
# What a training record of tiny.py holds: the step's own keys, nothing a plug-in put there.
TRAINING_KEYS = {"step", "train_loss", "grad_norm", "lr", "tokens_per_sec"}
EVALUATION_KEYS = {"step", "val_loss", "eval_train_loss"}


def _args(*extra: str, **settings) -> list[str]:
    flags = [f"--config.{k}={v}" for k, v in {**SETTINGS, **settings}.items()]
    return ["train", "--config", TINY, "--workdir", "run", "--progress=false", *flags, *extra]


def _train(folder: Path, *extra: str, **settings) -> subprocess.CompletedProcess:
    return cli_in(folder, *_args(*extra, **settings), check=False)


def _assert_own_keys(workdir: Path, *extra_keys: str) -> None:
    """Every record holds only the step's (or the evaluation's) own values under their keys."""
    for record in read_metrics(workdir):
        keys = set(record)
        own = TRAINING_KEYS | set(extra_keys) if "train_loss" in keys else EVALUATION_KEYS
        assert keys <= own, record
        assert isinstance(record["step"], int)


# ----------------------------------------------------------------------------- reserved keys

STEP_METRICS = """\
import jax.numpy as jnp


def _const(name, value):
    def metric(grads, updates, params):
        return {name: jnp.float32(value)}

    return metric


train_loss = _const("train_loss", 1.0)
val_loss = _const("val_loss", 0.0)
step = _const("step", 99.0)
grad_norm = _const("grad_norm", 0.0)
lr = _const("lr", 5.0)
tokens_per_sec = _const("tokens_per_sec", 0.0)
val_ppl = _const("val_ppl", 1.0)
"""


@pytest.mark.parametrize(
    "name", ["train_loss", "val_loss", "step", "grad_norm", "lr", "tokens_per_sec", "val_ppl"]
)
def test_a_step_metric_may_not_log_a_key_of_the_record(user_dir, name):
    """Issue 57, 1: {"train_loss": 1.0} made every record's train_loss 1.0, {"step": 99.0} made
    the run unresumable, {"tokens_per_sec": 0.0} was dropped, {"grad_norm": 0.0} was a 40-line
    traceback; now each is refused before training in one line naming the plug-in and key."""
    write_module(user_dir, "sm.py", STEP_METRICS)
    refused = _train(user_dir, f"--config.step_metrics=sm:{name}")
    assert refused.returncode == 1, refused.stderr
    [line] = error_lines(refused.stderr)
    assert line.startswith(f"minigpt-jax train: error: config.step_metrics='sm:{name}' "), line
    assert f"it logs {name!r}, a key the run's record writes" in line, line
    assert not (user_dir / "run").exists()


# ----------------------------------------------------------------------------- hooks

HOOKS = """\
import sys
import time
from pathlib import Path


class _Hook:
    every = 10

    def __init__(self, hooks_config):
        pass


class Exit0(_Hook):
    def on_step(self, ctx):
        sys.exit(0)


class Exit3(_Hook):
    def on_step(self, ctx):
        sys.exit(3)


class CtrlC(_Hook):
    def on_step(self, ctx):
        raise KeyboardInterrupt


class No(_Hook):
    def on_step(self, ctx):
        return "no"


class Abc(_Hook):
    every = "abc"

    def on_step(self, ctx):
        pass


class Stop(_Hook):
    def on_step(self, ctx):
        return True


class Sleepy(_Hook):
    def on_step(self, ctx):
        Path(ctx.workdir.parent / "sleeping").touch()
        while True:  # deaf: it never returns
            try:
                time.sleep(600)
            except Exception:
                pass
"""


@pytest.mark.parametrize(
    "hook, raised",
    [("Exit0", "SystemExit(0)"), ("Exit3", "SystemExit(3)"), ("CtrlC", "KeyboardInterrupt")],
)
def test_a_hook_that_ends_the_process_keeps_the_steps_and_exits_non_zero(user_dir, hook, raised):
    """Issue 57, 2: sys.exit(0) in on_step ended the run with rc 0, no message and no
    checkpoint (10 of 20 steps lost); sys.exit(3) with rc 3 and no word."""
    write_module(user_dir, "hk.py", HOOKS)
    failed = _train(user_dir, f"--config.hooks.names=hk:{hook}")
    assert failed.returncode == 1, failed.stderr
    lines = error_lines(failed.stderr)
    assert lines[0] == (
        f"minigpt-jax train: config.hooks.names='hk:{hook}' (on_step at step 10, saved first): "
        f"the hook raised {raised}; a hook may not end the process (return True to stop the run)"
    ), failed.stderr
    assert lines[1].endswith(f'{user_dir / "hk.py"}", line {_line(hook)}, in on_step')
    assert steps(user_dir / "run" / "checkpoints") == [10]
    _assert_own_keys(user_dir / "run")


def _line(hook: str) -> int:
    """The line of the statement in `hook`'s on_step that ends the process (HOOKS)."""
    lines = HOOKS.splitlines()
    start = lines.index(f"class {hook}(_Hook):")
    return start + 3  # class, def on_step, the statement: 1-based


@pytest.mark.parametrize(
    "hook, line, trained",
    [
        (  # Issue 57, 2: a hook returning "no" stopped the run at step 1 with rc 0.
            "No",
            "config.hooks.names='hk:No' (on_step at step 10, saved first) returned 'no' (str): "
            "a hook returns True to stop the run, False or None to go on.",
            [10],
        ),
        (  # Issue 57, 2: every = "abc" gave `invalid literal for int() with base 10: 'abc'`.
            "Abc",
            "config.hooks.names='hk:Abc': its `every` is 'abc' (str); it must be a whole "
            "number of steps between its on_step calls (0 or none: never).",
            None,
        ),
    ],
)
def test_a_hook_that_breaks_its_contract_is_one_line(user_dir, hook, line, trained):
    """A stop request is True/False/None, `every` a whole number: anything else is refused in
    one line naming the hook, the steps trained saved first."""
    write_module(user_dir, "hk.py", HOOKS)
    failed = _train(user_dir, f"--config.hooks.names=hk:{hook}")
    assert failed.returncode == 1
    assert error_lines(failed.stderr) == [f"minigpt-jax train: error: {line}"], failed.stderr
    if trained is None:
        assert not (user_dir / "run").exists()
    else:
        assert steps(user_dir / "run" / "checkpoints") == trained
        _assert_own_keys(user_dir / "run")


def test_an_early_stop_says_how_to_go_on(user_dir):
    """Issue 57, 2: an early stop said "rerun the same command to resume", which only stops
    again."""
    write_module(user_dir, "hk.py", HOOKS)
    stopped = _train(user_dir, "--config.hooks.names=hk:Stop")
    assert stopped.returncode == 0, stopped.stderr
    assert (
        "config.hooks.names='hk:Stop' asked to stop (on_step at step 10): the run ended early, "
        "at step 10 of num_steps=20" in stopped.stdout + stopped.stderr
    ), stopped.stderr
    assert "resume with the hook off" in stopped.stdout + stopped.stderr
    assert steps(user_dir / "run" / "checkpoints") == [10]
    resumed = _train(user_dir)  # the hook off: it trains on to num_steps
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step 10" in resumed.stdout
    assert steps(user_dir / "run" / "checkpoints") == [10, 20]
    _assert_own_keys(user_dir / "run")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_hook_that_hangs_still_answers_a_signal(user_dir, sig):
    """Issue 57, 2: an on_step that slept ignored seven SIGINT/SIGTERM over a minute; only
    kill -9 ended it, and steps 1-10 were lost. Now the hook is stopped 5 s after the signal,
    the trained steps are saved and the run exits 130/143."""
    write_module(user_dir, "hk.py", HOOKS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(user_dir)])}
    child = subprocess.Popen(
        [sys.executable, "-m", "minigpt_jax", *_args("--config.hooks.names=hk:Sleepy")],
        cwd=user_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not (user_dir / "sleeping").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    signalled = time.monotonic()
    child.send_signal(sig)
    output, _ = child.communicate(timeout=60)
    assert child.returncode == 128 + sig, output
    assert 5 <= time.monotonic() - signalled < 50, output
    assert (
        f"{sig.name} received while config.hooks.names='hk:Sleepy' ran on_step at step 10; it "
        "had not returned 5 s later, so it was stopped there." in output
    ), output
    assert f"{sig.name} received: checkpoint saved at step 10" in output, output
    assert steps(user_dir / "run" / "checkpoints") == [10]
    _assert_own_keys(user_dir / "run")


# ----------------------------------------------------------------------------- step metrics

HOST_METRICS = """\
import jax
import jax.numpy as jnp
import optax

_calls = [0]


def _on_host(norm):
    _calls[0] += 1
    if _calls[0] == 15:
        raise RuntimeError(f"the metric failed on the host at call {_calls[0]}")
    return norm


def late(grads, updates, params):
    norm = optax.tree.norm(grads)
    return {"host_norm": jax.pure_callback(_on_host, jax.ShapeDtypeStruct((), jnp.float32), norm)}


def nan(grads, updates, params):
    return {"log_neg": jnp.log(-1.0 + 0 * optax.tree.norm(grads)), "fine": jnp.float32(1)}
"""


def test_a_step_metric_whose_host_callback_raises_is_one_line_after_the_steps_are_saved(
    user_dir,
):
    """Issue 57, 3: a raising jax.pure_callback in a step metric was a 62-64-line traceback of
    JAX's callback frames, the key not named."""
    write_module(user_dir, "hm.py", HOST_METRICS)
    failed = _train(user_dir, "--config.step_metrics=hm:late")
    assert failed.returncode == 1
    assert_one_plugin_error(
        failed.stderr,
        "minigpt-jax train: error in user code of config.step_metrics='hm:late': RuntimeError: "
        "the metric failed on the host at call 15 (in the compiled step, a host callback)",
        f'{user_dir / "hm.py"}", line 11, in _on_host',
        "The 14 steps trained are kept in checkpoint 14",
    )
    assert steps(user_dir / "run" / "checkpoints") == [10, 14]
    assert [r["step"] for r in read_metrics(user_dir / "run")] == list(range(1, 15))
    _assert_own_keys(user_dir / "run", "host_norm")


def test_a_nan_step_metric_warns_once_per_key(user_dir):
    """Issue 57, 4: NaN or inf from a step metric was logged as "nan" in every record with no
    word."""
    write_module(user_dir, "hm.py", HOST_METRICS)
    ran = _train(user_dir, "--config.step_metrics=hm:nan")
    assert ran.returncode == 0, ran.stderr
    warnings = [line for line in ran.stderr.splitlines() if "is nan" in line]
    assert len(warnings) == 1, ran.stderr  # 20 steps, one warning
    assert (
        "the step value log_neg is nan at step 1 (a metric of config.step_metrics)" in (warnings[0])
    )
    assert {r["log_neg"] for r in read_metrics(user_dir / "run") if "train_loss" in r} == {"nan"}
    _assert_own_keys(user_dir / "run", "log_neg", "fine")


# ----------------------------------------------------------------------------- documents

TOKENIZER_WITHOUT_EOT = """\
from minigpt_jax.data.tokenizers import CharTokenizer


def no_eot(text, vocab_size, eot):
    return CharTokenizer.from_text(text if isinstance(text, str) else "".join(text))
"""


@pytest.mark.parametrize("data_format", ["memory", "shards"])
def test_a_tokenizer_without_end_of_text_is_named_for_packed_documents(user_dir, data_format):
    """Issue 57, 5: in memory and a fresh workdir, "...tokenizer.json has none (it was made for
    a model that does not pack documents): use a fresh workdir"; in shards, `int() argument
    must be a string, a bytes-like object or a real number, not 'NoneType'`."""
    write_module(user_dir, "tok.py", TOKENIZER_WITHOUT_EOT)
    refused = _train(
        user_dir, "--config.model.attention_mask=document", "--config.data.tokenizer=tok:no_eot",
        f"--config.data.format={data_format}",
    )  # fmt: skip
    assert refused.returncode == 1
    [line] = error_lines(refused.stderr)
    needs = {
        "memory": "packing documents (model.attention_mask) puts it after every document",
        "shards": "sharded corpora (data.format='shards') put it after every document",
    }[data_format]
    assert line == (
        "minigpt-jax train: error: data.tokenizer='tok:no_eot' made a tokenizer without an "
        f"end-of-text id, though it was asked for one (eot=True): {needs}. Make the entry honour "
        "eot=True (the end-of-text id last, as the built-in char and bpe tokenizers do), or "
        "pick one of those."
    ), line
    assert not (user_dir / "run").exists()


@pytest.mark.parametrize("data_format", ["memory", "shards"])
def test_end_of_text_written_inside_a_document_is_text(user_dir, data_format):
    """Issue 57, 5: with a BPE tokenizer the text "<|endoftext|>" inside a document encoded to
    the end-of-text id, so model.attention_mask=document cut that document in two. It is
    encoded as the text it is: one end-of-text id per document, after it."""
    text = pydoc_text()
    documents = [text[i : i + 1000] for i in range(0, 40_000, 1000)]
    documents[3] = documents[3][:500] + GPT2_EOT + documents[3][500:]
    lines = [json.dumps({"text": document}) for document in documents]
    (user_dir / "docs.jsonl").write_text("\n".join(lines) + "\n")
    settings = {"data.path": "docs.jsonl", "data.tokenizer": "bpe", "data.vocab_size": 300}
    settings.update({"data.format": data_format, "model.attention_mask": "document"})
    settings.update({"num_steps": 2, "eval_every": 2, "checkpoint_every": 2})
    _train(user_dir, **settings).check_returncode()
    run = user_dir / "run"
    tokenizer = load_tokenizer(run / "tokenizer.json")
    if data_format == "memory":
        ids = np.load(run / "tokens.npy")
    else:
        ids = np.concatenate([np.fromfile(p, np.uint16) for p in sorted(run.glob("shards/*.bin"))])
    assert int((ids == tokenizer.eot_id).sum()) == len(documents)
    assert GPT2_EOT in tokenizer.decode(ids[: np.flatnonzero(ids == tokenizer.eot_id)[4]])


# ----------------------------------------------------------------------------- options


def test_the_samples_prompt_is_checked_before_training(user_dir):
    """Issue 57, 8: sample_prompt=日本語 trained 10 steps, then stopped at the first sample."""
    failed = _train(
        user_dir, "--config.hooks.names=samples", "--config.hooks.sample_prompt=日本語",
        "--config.hooks.sample_every=10",
    )  # fmt: skip
    assert failed.returncode == 1
    [line] = error_lines(failed.stderr)
    assert line.startswith(
        "minigpt-jax train: error: config.hooks.sample_prompt='日本語' (the samples hook): "
        "character '日' at position 0 is not in the CharTokenizer vocabulary"
    ), line
    assert not (user_dir / "run").exists()
