"""What a scaling study is: its IsoFLOP grid (compute budgets C; per budget the model shapes of
a width/depth ladder that fit it; per run the tokens D = C / FLOPs per token and a schedule as
long as those tokens), where each run lives (OUT/RUN/seed-0/, an ordinary run directory) and
the study's identity, recorded in OUT/scale.json so a rerun of the same command resumes it and
any other command is refused, naming what differs. Every problem is a ScaleError of one line,
raised before anything is written.

FLOPs are the README's MFU count, `minigpt_jax.flops_per_token`: 6 per weight the matmuls
touch (the tied token table counts, as the head's matmul; a learned position table, a lookup,
does not) plus attention's 12·N·H·K·T. N in the fits is that same weight count.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from minigpt_apps.compare import plan as compare_plan
from minigpt_apps.sweep import space as spaces
from minigpt_apps.sweep.study import _flat as flat_config

IDENTITY_FILE = "scale.json"
LOCK_FILE = ".scale.lock"
SEED = 0  # one run per grid point: the seed-to-seed spread is the fit's residual
_SHAPE = re.compile(r"^\s*(\d+)\s*[x×]\s*(\d+)\s*$")


class ScaleError(ValueError):
    """A bad argument, an impossible grid or a refused OUT: one line, nothing written."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model shape of the ladder: layers, width and heads (width / head size)."""

    n_layer: int
    n_embd: int
    n_head: int

    @property
    def name(self) -> str:
        return f"L{self.n_layer}-D{self.n_embd}"

    def values(self) -> dict[str, int]:
        return {
            "model.n_layer": self.n_layer,
            "model.n_embd": self.n_embd,
            "model.n_head": self.n_head,
        }


@dataclasses.dataclass(frozen=True)
class Point:
    """One run of the grid (or the check): its budget, shape, weights, tokens and steps."""

    budget: float  # the budget C it belongs to (FLOPs)
    shape: Shape
    params: int  # N: the weights flops_per_token counts
    flops_per_token: int
    num_steps: int
    tokens: int  # D = num_steps × batch_size × block_size
    name: str  # its folder in OUT

    @property
    def flops(self) -> float:
        """The compute it really trains with (steps round down to whole calls)."""
        return float(self.flops_per_token) * self.tokens


@dataclasses.dataclass
class Study:
    """A checked scale command: the base config, the grid and the study's identity."""

    config_spec: str
    out: Path
    fixed: dict[str, Any]
    budgets: list[float]
    points: list[Point]
    schedule: str
    warmup_fraction: float
    tokens_per_step: int
    steps_per_call: int
    vocab_size: int
    identity: dict[str, Any]
    dropped: list[str]  # (budget, shape) pairs left out of the grid, and why

    def values(self, point: Point) -> dict[str, Any]:
        """The dotted keys the run of `point` sets over the base config."""
        k = self.steps_per_call
        warmup = int(round(self.warmup_fraction * point.num_steps))
        every = max(k, point.num_steps // 4 // k * k)  # about 4 checkpoints: kill -9 loses little
        return {
            **self.fixed,
            **point.shape.values(),
            "num_steps": point.num_steps,
            "eval_every": point.num_steps,  # the final val loss is the run's value
            "checkpoint_every": every,
            "optim.warmup_steps": min(warmup, point.num_steps - 1),
            "optim.schedule": self.schedule,
            "seed": SEED,
        }


# ----------------------------------------------------------------------------- parsing


def parse_budgets(text: str, base: float | None) -> list[float]:
    """`--budgets 1e12,3e12` (FLOPs) or, with --base_budget B, multiples of B; sorted."""
    try:
        values = [float(word) for word in text.split(",") if word.strip()]
    except ValueError:
        raise ScaleError(
            f"--budgets {text!r}: give FLOPs (1e12,3e12,1e13) or multiples with --base_budget."
        ) from None
    if base is not None:
        if not (math.isfinite(base) and base > 0):
            raise ScaleError(f"--base_budget {base} must be a positive number of FLOPs.")
        values = [v * base for v in values]
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ScaleError(f"--budgets {text!r}: each budget is a positive number of FLOPs.")
    if len(set(values)) != len(values):
        raise ScaleError(f"--budgets {text!r} repeats a budget; list each once.")
    if len(values) < 3:
        raise ScaleError(
            f"--budgets {text!r}: the N_opt(C) frontier needs 3 budgets (a line through 2 shows "
            "no scatter); give 3 or more."
        )
    return sorted(values)


def ladder(depths: list[int], aspect: float, head_dim: int) -> list[Shape]:
    """Shapes at each depth L with width D = aspect·L rounded to whole heads of `head_dim`
    (so head size is fixed and D/L stays near `aspect`, Kaplan et al.'s sensible band)."""
    shapes = []
    for depth in depths:
        heads = max(1, round(aspect * depth / head_dim))
        shapes.append(Shape(depth, heads * head_dim, heads))
    return shapes


def parse_sizes(text: str, head_dim: int) -> list[Shape]:
    """`--sizes 2x64,3x96`: LAYERSxWIDTH shapes, each width a whole number of heads."""
    shapes = []
    for word in text.split(","):
        match = _SHAPE.match(word)
        if match is None:
            raise ScaleError(f"--sizes {text!r}: write LAYERSxWIDTH shapes, e.g. 2x64,3x96.")
        depth, width = int(match[1]), int(match[2])
        if depth < 1 or width < head_dim or width % head_dim:
            raise ScaleError(
                f"--sizes {word.strip()}: the width must be a positive multiple of the head "
                f"size {head_dim} (--head_dim)."
            )
        shapes.append(Shape(depth, width, width // head_dim))
    return shapes


def parse_depths(text: str) -> list[int]:
    try:
        depths = [int(word) for word in text.split(",")]
    except ValueError:
        raise ScaleError(f"--depths {text!r}: give layer counts, e.g. 1,2,3,4.") from None
    if not all(d >= 1 for d in depths) or len(set(depths)) != len(depths):
        raise ScaleError(f"--depths {text!r}: layer counts of 1 or more, each once.")
    return sorted(depths)


# ----------------------------------------------------------------------------- FLOPs


def vocab_size_of(config) -> int:
    """The vocabulary the runs will have: data.vocab_size for BPE (exact by construction),
    the corpus's distinct characters for char (read here, as a run reads it)."""
    data = config.data
    if data.tokenizer == "bpe":
        return int(data.vocab_size)
    if data.tokenizer != "char":
        raise ScaleError(
            f"data.tokenizer={data.tokenizer!r}: scale counts FLOPs before training, from a "
            "vocabulary it can know then; use char or bpe."
        )
    from minigpt_jax.data.sources import load_text
    from minigpt_jax.data.tokenizers import CharTokenizer

    try:
        text = load_text(data.corpus, data.path, data.text_field, file_format=data.file_format)
    except (OSError, ValueError) as error:
        raise ScaleError(f"the corpus cannot be read to count its characters: {error}") from None
    return CharTokenizer.from_text(text).vocab_size


def model_of(config, shape: Shape, vocab_size: int):
    """The GPTConfig of the base config at `shape`."""
    from minigpt_jax.config_dict import gpt_config_from

    return gpt_config_from(config, vocab_size).replace(
        n_layer=shape.n_layer, n_embd=shape.n_embd, n_head=shape.n_head
    )


def counted_params(cfg) -> int:
    """N: the weights flops_per_token counts 6 FLOPs for (all but a learned position table)."""
    from minigpt_jax import POSITION_ENCODINGS, count_params

    n = count_params(cfg)
    if POSITION_ENCODINGS[cfg.pos_encoding].learned:
        n -= cfg.block_size * cfg.n_embd
    return n


def point_at(
    budget: float, shape: Shape, cfg, tokens_per_step: int, steps_per_call: int, name: str
) -> Point:
    """The run of `shape` at `budget`: D = C / FLOPs-per-token, in whole calls of steps."""
    from minigpt_jax import flops_per_token

    per_token = flops_per_token(cfg)
    steps = int(budget / per_token / tokens_per_step) // steps_per_call * steps_per_call
    return Point(
        budget, shape, counted_params(cfg), per_token, steps, steps * tokens_per_step, name
    )


def budget_name(budget: float) -> str:
    return f"C{budget:.3g}".replace("+", "")


# ----------------------------------------------------------------------------- the grid


def plan(
    config_spec: str,
    out: Path,
    sets: list[str],
    budgets: list[float],
    shapes: list[Shape],
    *,
    schedule: str | None,
    warmup_fraction: float,
    min_steps: int,
    max_steps: int | None,
) -> Study:
    """The checked grid: every budget with at least 3 shapes that fit it (min_steps ≤ steps ≤
    max_steps), every shape in some budget, every run's config complete and checked."""
    from minigpt_jax.config_dict import check_experiment_config, config_file_of

    if out.exists() and not out.is_dir():
        raise ScaleError(f"--out {out} is a file; name a folder for the study.")
    if not 0 <= warmup_fraction < 1:
        raise ScaleError(f"--warmup_fraction {warmup_fraction} must be in [0, 1).")
    if min_steps < 1 or (max_steps is not None and max_steps < min_steps):
        raise ScaleError("--min_steps must be at least 1 and --max_steps at least --min_steps.")
    if len({s.name for s in shapes}) != len(shapes):
        raise ScaleError("two sizes have the same shape; list each once.")
    config_spec = config_file_of(config_spec)
    try:
        spaces.base_config(config_spec)
    except ValueError as error:
        raise ScaleError(str(error)) from None
    set_texts: dict[str, str] = {}
    for argument in sets:
        for key, text in compare_plan._settings(argument, f"--set {argument}").items():
            if key in set_texts:
                raise ScaleError(f"--set {key} is given twice; keep one.")
            set_texts[key] = text
    owned = {"model.n_layer", "model.n_embd", "model.n_head", "num_steps", "eval_every"}
    owned |= {"checkpoint_every", "optim.warmup_steps", "optim.schedule", "seed"}
    taken = sorted(owned & set(set_texts))
    if taken:
        raise ScaleError(
            f"--set {taken[0]}: the study sets it per run (shape, length, schedule); drop it."
        )
    try:
        fixed = compare_plan._typed(config_spec, set_texts, "--set")
    except compare_plan.CompareError as error:
        raise ScaleError(str(error)) from None
    try:
        base = check_experiment_config(spaces.config_with(config_spec, fixed))
    except ValueError as error:
        raise ScaleError(str(error)) from None
    schedule = schedule or base.optim.schedule
    if schedule not in ("cosine", "wsd"):
        raise ScaleError(
            f"--schedule {schedule}: a run's schedule must end with its tokens; cosine or wsd."
        )
    tokens_per_step = base.batch_size * base.model.block_size
    k = base.steps_per_call
    vocab = vocab_size_of(base)
    models = {shape: model_of(base, shape, vocab) for shape in shapes}
    points, dropped, fits = [], [], {shape: 0 for shape in shapes}
    for budget in budgets:
        here, why_not = [], []
        for shape in shapes:
            name = f"{budget_name(budget)}_{shape.name}"
            point = point_at(budget, shape, models[shape], tokens_per_step, k, name)
            if point.num_steps < min_steps:
                why_not.append(f"{shape.name}: {point.num_steps} steps < --min_steps {min_steps}")
            elif max_steps is not None and point.num_steps > max_steps:
                why_not.append(f"{shape.name}: {point.num_steps} steps > --max_steps {max_steps}")
            else:
                here.append(point)
                fits[shape] += 1
        if not here:
            small = min(shapes, key=lambda s: models[s].n_layer * models[s].n_embd)
            raise ScaleError(
                f"budget {budget:.3g} FLOPs is too small for any size (the smallest, "
                f"{small.name}, gets {why_not[0].split(': ')[1]}); raise it or add smaller sizes."
            )
        if len(here) < 3:
            raise ScaleError(
                f"budget {budget:.3g} FLOPs fits only {len(here)} of the sizes (an IsoFLOP "
                f"parabola needs 3): {'; '.join(why_not)}."
            )
        points += here
        dropped += [f"{budget:.3g}: {line}" for line in why_not]
    unused = [shape.name for shape, count in fits.items() if count == 0]
    if unused:
        raise ScaleError(
            f"sizes {', '.join(unused)} do not fit any budget (steps outside --min_steps.."
            "--max_steps); drop them or change the budgets."
        )
    study = Study(
        config_spec=config_spec,
        out=out,
        fixed=fixed,
        budgets=budgets,
        points=points,
        schedule=schedule,
        warmup_fraction=warmup_fraction,
        tokens_per_step=tokens_per_step,
        steps_per_call=k,
        vocab_size=vocab,
        identity={},
        dropped=dropped,
    )
    for point in points:
        try:
            check_experiment_config(spaces.config_with(config_spec, study.values(point)))
        except ValueError as error:
            raise ScaleError(f"run {point.name}: {error}") from None
    study.identity = {
        "config_file_sha256": spaces.file_digest(config_spec),
        "config": compare_plan._plain(base.to_dict()),
        "set": compare_plan._plain(fixed),
        "budgets": budgets,
        "sizes": [shape.name for shape in shapes],
        "schedule": schedule,
        "warmup_fraction": warmup_fraction,
        "runs": {p.name: {"steps": p.num_steps, "params": p.params} for p in points},
    }
    return study


def check_point(study: Study, budget: float, shape: Shape) -> Point:
    """The check run: `shape` trained on `budget` (the predicted optimum's nearest shape)."""
    from minigpt_jax.config_dict import check_experiment_config

    base = check_experiment_config(spaces.config_with(study.config_spec, study.fixed))
    cfg = model_of(base, shape, study.vocab_size)
    name = f"check_{budget_name(budget)}_{shape.name}"
    return point_at(budget, shape, cfg, study.tokens_per_step, study.steps_per_call, name)


# ----------------------------------------------------------------------------- OUT


def differences(saved: dict, mine: dict) -> str:
    """Words for what differs between two identities."""
    words = []
    if saved.get("config_file_sha256") != mine.get("config_file_sha256"):
        words.append("the --config file's content")
    flags = (("set", "--set"), ("budgets", "--budgets"), ("sizes", "the sizes"))
    flags += (("schedule", "--schedule"), ("warmup_fraction", "--warmup_fraction"))
    for name, flag in flags:
        if saved.get(name) != mine.get(name):
            words.append(f"{flag} ({saved.get(name)!r} then, {mine.get(name)!r} now)")
    if not words:
        before, after = flat_config(saved.get("config", {})), flat_config(mine.get("config", {}))
        changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
        if changed:
            words.append(f"the config ({', '.join(f'config.{k}' for k in changed)})")
        elif saved.get("runs") != mine.get("runs"):
            words.append("the runs in the grid (--min_steps/--max_steps)")
    return "; ".join(words) or "its settings"


def adds_budgets(saved: dict, mine: dict) -> bool:
    """Whether identity `mine` is `saved` with budgets added: every other setting the same,
    every saved budget kept and each saved run in the grid unchanged (its ended run is read,
    not trained again)."""
    others = (set(saved) | set(mine)) - {"budgets", "runs"}
    return (
        all(saved.get(key) == mine.get(key) for key in others)
        and set(saved.get("budgets", ())) < set(mine.get("budgets", ()))
        and all(mine.get("runs", {}).get(name) == run for name, run in saved["runs"].items())
    )


def check_out(study: Study) -> bool:
    """Whether OUT already holds this study; refuses one holding another (or a folder that is
    not a study's and is not empty). A study with budgets added to OUT's (`adds_budgets`)
    grows it: False, like a new one (its identity is written again), and its ended runs are
    read."""
    out, path = study.out, study.out / IDENTITY_FILE
    if not path.exists():
        if out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir()):
            raise ScaleError(
                f"--out {out} is a folder of other things (no {IDENTITY_FILE}); give a new or "
                "empty folder."
            )
        return False
    try:
        saved = json.loads(path.read_text())["identity"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        why = f"{path} is unreadable ({type(error).__name__}); give another --out."
        raise ScaleError(why) from None
    if saved != study.identity and adds_budgets(saved, study.identity):
        return False  # a grown study: its identity is written again, its ended runs are read
    if saved != study.identity:
        raise ScaleError(
            f"--out {out} holds another study: {differences(saved, study.identity)}; rerun its "
            f"own command (in {path}) to resume it, or give another --out."
        )
    return True


def write_identity(study: Study, command: list[str]) -> None:
    """OUT/scale.json: the identity, and the command that made it (to rerun it)."""
    path = study.out / IDENTITY_FILE
    text = json.dumps({"command": command, "identity": study.identity}, indent=1)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
