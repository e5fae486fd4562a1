"""Plug-ins as a researcher writes them, from files in a folder outside the package and through
the command line: settings an entry declares, errors that point at the plug-in's own file and
line, entries checked against their registry's contract before anything is written, and a
run's identity that includes the plug-ins' source."""

import hashlib
import json
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import cli_in

from minigpt_jax import forward, init_params
from minigpt_jax.config_dict import check_experiment_config, default_config, gpt_config_from
from minigpt_jax.settings import options_of

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.py")

# The full suite only (`python -m pytest -q`): plug-ins through the CLI.
pytestmark = pytest.mark.slow

MASKS = """\
from minigpt_jax.settings.registry import declares
from minigpt_jax.settings.groups import MODEL, options_of, setting


@declares(window=setting(4, "keys each query sees, itself included", MODEL, low=1))
def sliding_window(q_positions_BxT, k_positions_BxS, cfg):
    window = options_of(cfg, sliding_window).window
    q_Bx1xTx1 = q_positions_BxT[:, None, :, None]
    k_Bx1x1xS = k_positions_BxS[:, None, None, :]
    return (k_Bx1x1xS <= q_Bx1xTx1) & (k_Bx1x1xS > q_Bx1xTx1 - window)
"""

OPTS = """\
import optax

from minigpt_jax.settings.registry import declares
from minigpt_jax.settings.groups import TRAJECTORY, options_of, setting


@declares(sf_b1=setting(0.9, "schedule-free's interpolation", TRAJECTORY, low=0.0, high=1.0))
def schedule_free(optim, learning_rate):
    return optax.contrib.schedule_free_adamw(optim.lr, b1=options_of(optim, schedule_free).sf_b1)
"""


def _write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def _train(folder: Path, workdir: str, *extra: str, check: bool = True):
    return cli_in(
        folder,
        "train",
        "--config",
        TINY,
        "--workdir",
        workdir,
        "--config.num_steps=2",
        "--config.eval_every=2",
        "--config.checkpoint_every=2",
        "--config.eval_batches=1",
        "--progress=false",
        *extra,
        check=check,
    )


def _meta(workdir: Path) -> dict:
    (path,) = workdir.glob("checkpoints/*/meta/metadata")
    return json.loads(path.read_text())


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    _write(tmp_path, "my_masks.py", MASKS)
    _write(tmp_path, "my_opts.py", OPTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


# ----------------------------------------------------------------------------- entry settings


def test_an_entry_setting_is_listed_overridden_checked_and_recorded(user_dir):
    pick = "--config.model.attention_mask=my_masks:sliding_window"
    listed = cli_in(user_dir, "settings", "--config", TINY, pick, "--config.model.window=8")
    (line,) = [line for line in listed.stdout.splitlines() if line.split()[:1] == ["window"]]
    assert line.split()[:3] == ["window", "8", "model"]
    assert "my_masks:sliding_window" in line

    refused = _train(user_dir, "runs/zero", pick, "--config.model.window=0", check=False)
    assert refused.returncode != 0
    assert "config.model.window must be a positive integer, got 0" in refused.stderr
    assert not (user_dir / "runs" / "zero").exists()

    _train(user_dir, "runs/w2", pick, "--config.model.window=2")
    meta = _meta(user_dir / "runs" / "w2")
    assert meta["config"]["model"]["window"] == 2
    assert meta["gpt_config"]["entry_settings"] == [["window", 2]]
    # A MODEL setting must match on resume.
    other = _train(user_dir, "runs/w2", pick, "--config.model.window=3", check=False)
    assert "holds a different model" in other.stderr
    assert "config.model.window: 2 -> 3" in other.stderr


def test_the_window_setting_changes_what_the_model_sees(user_dir):
    config = default_config()
    config.model.update(block_size=16, n_layer=1, n_head=2, n_embd=32, dropout=0.0)
    config.model.attention_mask = "my_masks:sliding_window"
    config.model.window = 2
    config = check_experiment_config(config)
    cfg2 = gpt_config_from(config, 64)
    import my_masks

    assert options_of(cfg2, my_masks.sliding_window).window == 2
    cfg4 = gpt_config_from(check_experiment_config({"model": {**config.model, "window": 4}}), 64)
    params = init_params(cfg2, jax.random.key(0))
    tokens_BxT = jax.random.randint(jax.random.key(1), (1, 12), 0, 64)
    edited_BxT = tokens_BxT.at[:, 5].set((tokens_BxT[:, 5] + 1) % 64)
    # One layer of window 2 sees t-1..t: token 5 reaches positions 5 and 6 only.
    np.testing.assert_array_equal(
        forward(params, tokens_BxT, cfg2)[:, 7:], forward(params, edited_BxT, cfg2)[:, 7:]
    )
    assert not np.allclose(
        forward(params, tokens_BxT, cfg4)[:, 7:], forward(params, edited_BxT, cfg4)[:, 7:]
    )


def test_an_optimizer_setting_is_a_trajectory_setting(user_dir):
    pick = "--config.optim.name=my_opts:schedule_free"
    _train(user_dir, "runs/sf", pick, "--config.optim.sf_b1=0.95")
    assert _meta(user_dir / "runs" / "sf")["config"]["optim"]["sf_b1"] == 0.95
    more = ("--config.num_steps=4", "--config.checkpoint_every=2")
    refused = _train(user_dir, "runs/sf", pick, "--config.optim.sf_b1=0.9", *more, check=False)
    assert "config.optim.sf_b1: 0.95 -> 0.9" in refused.stderr
    assert "--allow_resume_changes" in refused.stderr


def test_a_clash_with_a_built_in_setting_names_both(user_dir):
    _write(
        user_dir,
        "clash.py",
        """\
        from minigpt_jax.settings.registry import declares
        from minigpt_jax.settings.groups import TRAJECTORY, setting


        @declares(b1=setting(0.5, "mine", TRAJECTORY))
        def opt(optim, learning_rate):
            raise AssertionError("never built")
        """,
    )
    config = default_config()
    config.optim.name = "clash:opt"
    with pytest.raises(ValueError, match=r"optim.name='clash:opt'.*'b1'.*config.optim.b1"):
        check_experiment_config(config)


def test_a_model_entry_whose_file_imports_the_optimizers_loads_in_a_fresh_process(tmp_path):
    """A model entry kept in one file with an optimizer (the file imports
    minigpt_jax.optimizers): the run it trained loads and samples in a fresh process, where
    the entry's import is the first to import the optimizers (issue 52: building GPTConfig
    once raised "dictionary changed size during iteration" while that import registered the
    optimizers' registries)."""
    _write(tmp_path, "my_masks.py", "import minigpt_jax.optimizers  # noqa: F401\n" + MASKS)
    _train(tmp_path, "runs/w", "--config.model.attention_mask=my_masks:sliding_window")
    sampled = cli_in(
        tmp_path, "sample", "--workdir", "runs/w", "--prompt=a", "--max_new_tokens=3", check=False
    )
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert sampled.stdout.startswith("a") and len(sampled.stdout.rstrip("\n")) > 1  # prompt + text


# ----------------------------------------------------------------------------- plug-in errors

BAD = """\
import flax.linen as nn
import jax.numpy as jnp


def narrow(x):
    return x[..., :1]


def two_args(x, y):
    return x


def keepdim_term(logits_ExV, targets_E):
    return jnp.sum(logits_ExV, keepdim=True)


def wide_term(logits_ExV, targets_E):
    return logits_ExV


def nan_term(logits_ExV, targets_E):
    return jnp.full(targets_E.shape, jnp.nan)


def many_tokens_term(logits_ExV, targets_E):
    if logits_ExV.shape[0] > 6:  # the probe's 6 tokens pass; the training step's do not
        raise ValueError("this term takes at most 6 tokens")
    return targets_E * 0.0


def three(optim, learning_rate):
    return 3


def half_mask(q_positions_BxT, k_positions_BxS, cfg):
    return (k_positions_BxS[:, None, None, :] <= q_positions_BxT[:, None, :, None])[..., :1]


def not_a_module(cfg, name):
    return 3


def squashing_norm(cfg, name):
    return nn.Dense(1, name=name)
"""


@pytest.fixture
def bad_dir(user_dir):
    _write(user_dir, "bad.py", BAD)
    _write(user_dir, "syn.py", "def f(x):\n    return x +\n")
    return user_dir


def _last_lines(text: str, n: int) -> list[str]:
    return text.strip().splitlines()[-n:]


def test_an_import_time_syntax_error_names_the_key_and_the_line(bad_dir):
    result = _train(bad_dir, "runs/syn", "--config.model.activation=syn:f", check=False)
    assert result.returncode == 1
    header, where, source = _last_lines(result.stderr, 3)
    assert header.startswith("minigpt-jax train: error in user code of ")
    assert "config.model.activation='syn:f': SyntaxError" in header
    assert where == f'  File "{bad_dir / "syn.py"}", line 2' and source == "    return x +"
    assert "Traceback" not in result.stderr
    assert not (bad_dir / "runs").exists()
    full = _train(
        bad_dir, "runs/syn", "--config.model.activation=syn:f", "--traceback", check=False
    )
    assert "Traceback (most recent call last)" in full.stderr


def test_a_trace_time_error_names_the_key_and_the_line_and_leaves_the_workdir(bad_dir):
    """The term passes its probe but raises when the training step is traced, after the data
    was cached and the checkpoint folders made: all of that goes again."""
    (bad_dir / "runs" / "empty").mkdir(parents=True)
    for workdir in ("runs/fresh", "runs/empty"):
        result = _train(bad_dir, workdir, "--config.loss.terms=bad:many_tokens_term", check=False)
        header, where, source = _last_lines(result.stderr, 3)
        assert header == (
            "minigpt-jax train: error in user code of config.loss.terms='bad:many_tokens_term': "
            "ValueError: this term takes at most 6 tokens"
        )
        lines = [text.strip() for text in BAD.splitlines()]
        line = lines.index(source.strip()) + 1  # the raise, in the file written above
        assert where == f'  File "{bad_dir / "bad.py"}", line {line}, in many_tokens_term'
        assert source == '    raise ValueError("this term takes at most 6 tokens")'
    assert not (bad_dir / "runs" / "fresh").exists()
    assert list((bad_dir / "runs" / "empty").iterdir()) == []


def test_a_nan_from_a_loss_term_is_named(bad_dir):
    result = _train(bad_dir, "runs/nan", "--config.loss.terms=bad:nan_term", check=False)
    error = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and "the loss term bad:nan_term gave nan at step 1" in error[0]
    assert "optim.lr" not in error[0]  # the cause named, not the learning-rate advice


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "model.activation",
            "bad:narrow",
            r"its output must have shape \(2, 3, 512\), got \(2, 3, 1\)",
        ),
        ("model.activation", "bad:two_args", r"x -> x.*but its signature is two_args\(x, y\)"),
        ("model.activation", "builtins:input", r"builtins.input, a builtin\); it was not called"),
        ("optim.name", "os:system", r"posix.system, a builtin\); it was not called"),
        ("optim.name", "bad:three", r"it returned int \(3\), not an optax.GradientTransformation"),
        ("loss.terms", "bad:wide_term", r"values_E .* must have shape \(6,\), got \(6, 11\)"),
        ("loss.terms", "bad:keepdim_term", r"keepdim"),
        ("model.attention_mask", "bad:half_mask", r"shape \(2, 1, 5, 1\).*\(B, H, T, S\)"),
        ("model.norm", "bad:not_a_module", r"returned int, not a flax module"),
        ("model.norm", "bad:squashing_norm", r"must have shape \(2, 3, 128\), got \(2, 3, 1\)"),
    ],
)
def test_an_entry_that_breaks_its_contract_is_refused_naming_the_key(
    bad_dir, monkeypatch, key, value, message
):
    """Checked on a probe input by check_experiment_config, which runs before anything is
    written; a builtin is refused without being called (input() would wait on stdin)."""
    reads = []
    monkeypatch.setattr(sys, "stdin", type("Spy", (), {"readline": lambda s: reads.append(1)})())
    config = default_config()
    group, name = key.split(".")
    config[group][name] = value
    with pytest.raises(Exception, match=rf"config.{key}='{value}'(.|\n)*{message}"):
        check_experiment_config(config)
    assert reads == []


def test_a_contract_violation_is_refused_before_the_workdir_is_made(bad_dir):
    result = _train(bad_dir, "runs/narrow", "--config.model.activation=bad:narrow", check=False)
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "minigpt-jax train: error: config.model.activation='bad:narrow' breaks the activation "
            "contract: its output must have shape (2, 3, 128), got (2, 3, 1)"
        )
    )
    assert not (bad_dir / "runs").exists()


def test_the_built_in_entries_keep_their_registries_contracts():
    from minigpt_jax.settings.registry import REGISTRIES

    config = check_experiment_config(default_config())
    cfg = gpt_config_from(config, 16)
    checked = 0
    for registry in REGISTRIES.values():
        if registry.contract is None:
            continue
        for name in registry.names():
            if registry.config_key == "model.attention" and name == "cudnn":
                if jax.default_backend() != "gpu":
                    continue  # cuDNN's kernel runs on NVIDIA GPUs only (tests/test_gpu.py)
            group = registry.group
            probe = cfg if group == "model" else config[group] if group else config
            if registry.group == "model":
                # The probe config picks the entry, so the settings it declares are there; a
                # pick this config cannot build (cuDNN in float32) is probed on the default.
                picked = config.copy_and_resolve_references()
                picked.model[registry.config_key.split(".", 1)[1]] = name
                try:
                    probe = gpt_config_from(check_experiment_config(picked), 16)
                except ValueError:
                    pass
            registry.check_contract(name, probe)
            checked += 1
    assert checked >= 12


# ----------------------------------------------------------------------------- identity


def test_a_resume_on_edited_plug_in_code_is_refused_before_anything_is_written(user_dir):
    losses = _write(
        user_dir, "my_losses.py", "def zero(logits_ExV, targets_E):\n    return 0.0 * targets_E\n"
    )
    pick = "--config.loss.terms=my_losses:zero"
    _train(user_dir, "runs/id", pick)
    digest = _meta(user_dir / "runs" / "id")["plugins"]
    assert digest == {"my_losses": hashlib.sha256(losses.read_bytes()).hexdigest()}

    losses.write_text(losses.read_text().replace("0.0 *", "0.0 + 0.0 *"))
    workdir = user_dir / "runs" / "id"
    before = {p: p.stat().st_mtime_ns for p in workdir.rglob("*")}
    more = ("--config.num_steps=4",)
    refused = _train(user_dir, "runs/id", pick, *more, check=False)
    message = refused.stderr.strip().splitlines()[-1]
    assert "was trained with other plug-in code: the source of module my_losses" in message
    assert "config.loss.terms='my_losses:zero'" in message and "--allow_resume_changes" in message
    assert {p: p.stat().st_mtime_ns for p in workdir.rglob("*")} == before
    accepted = _train(user_dir, "runs/id", pick, *more, "--allow_resume_changes")
    assert "resumed from step 2" in accepted.stdout
