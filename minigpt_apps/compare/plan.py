"""What a comparison is: its arms (the base config with each arm's overrides, typed and checked
like the sweep's --set), its seeds, where each run lives (OUT/ARM/seed-S/, config.seed = S) and
its identity, recorded in OUT/compare.json with the code version so a rerun of the same
command resumes it (or, with more seeds or arms, grows it) and any other command, or other code,
is refused, naming what differs. Every problem is a CompareError of one line,
raised before anything is written."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from minigpt_apps.sweep import space as spaces
from minigpt_apps.sweep.study import _flat as flat_config
from minigpt_jax.config_dict import add_entry_settings, check_experiment_config, config_file_of
from minigpt_jax.settings.registry import user_module_digests

BASELINE = "baseline"  # the unchanged config's arm, unless --baseline names another
IDENTITY_FILE = "compare.json"
LOCK_FILE = ".compare.lock"  # one command at a time on OUT
METRICS = ("final_val_loss", "best_val_loss", "time_to_target")
MAX_SEED_COUNT = 100_000  # --seeds N: more runs than any comparison trains
AA_ARM = "aa"  # --aa: the config unchanged again, on seeds AA_SEED_OFFSET above the baseline's
AA_SEED_OFFSET = 2**30  # disjoint from every seed of the baseline's (< 2**30), however many
EVAL_KEY = 0  # config.eval_seed of every run: one fixed eval set across arms and seeds
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_NEXT_SETTING = re.compile(r",(?=\s*[A-Za-z_][\w.]*\s*=)")  # a comma that starts key=value


class CompareError(ValueError):
    """A bad argument or a refused OUT: printed as one line, nothing written."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: its name and the typed values it sets over the base config (and --set)."""

    name: str
    overrides: dict[str, Any]
    config_spec: str  # the config file[:arg] the overrides apply to
    about: str = ""  # where the arm comes from, when not from --arm
    seed_offset: int = 0  # trained at seed S + this for the pair at seed S (--aa)

    def described(self) -> str:
        if self.seed_offset:
            return f"the config unchanged, on seeds S + {self.seed_offset} (A/A)"
        shown = ", ".join(f"{k}={v!r}" for k, v in self.overrides.items())
        if self.about:
            return f"{self.about}: {shown}" if shown else self.about
        return shown or "the config unchanged"


@dataclasses.dataclass
class Comparison:
    """A checked compare command: arms (the baseline first), seeds, OUT and its identity."""

    config_spec: str
    out: Path
    fixed: dict[str, Any]
    arms: list[Arm]
    seeds: list[int]
    num_steps: int
    identity: dict[str, Any]
    tokens_per_step: dict[str, int]  # by arm name: batch_size × block_size
    eval_tokens: dict[str, int] = dataclasses.field(default_factory=dict)  # by arm, per pass
    eval_every: dict[str, int] = dataclasses.field(default_factory=dict)  # by arm name
    eval_values: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # by arm
    notes: tuple[str, ...] = ()  # lines the report gives first (a sweep winner's origin)
    sweep_value: tuple[str, float] | None = None  # (the sweep's objective, the winner's value)
    tuned_seeds: list[int] = dataclasses.field(default_factory=list)  # the winner's own seed

    @property
    def baseline(self) -> Arm:
        return self.arms[0]

    def values(self, arm: Arm, seed: int) -> dict[str, Any]:
        """The dotted keys the run of `arm` at (pair) `seed` sets over the base config."""
        own = {**self.fixed, **arm.overrides, **self.eval_values.get(arm.name, {})}
        return {**own, "seed": seed + arm.seed_offset}

    def run_dir(self, arm: Arm, seed: int) -> Path:
        return self.out / arm.name / f"seed-{seed + arm.seed_offset}"

    def run_doc(self, arm: Arm, seed: int) -> str:
        """The docstring of the run's config.py: what the run is part of."""
        return (
            f"Arm {arm.name} at seed {seed} of the comparison in {self.out} (minigpt-jax "
            f"compare): {arm.described()}."
        )

    def runs(self) -> list[tuple[Arm, int]]:
        """Every (arm, seed), seed by seed, so the first runs to finish are whole pairs; then
        both arms at a sweep winner's tuned seed (the paired winner's-curse check)."""
        seeds = [*self.seeds, *self.tuned_seeds]
        return [(arm, seed) for seed in seeds for arm in self.arms]


def parse_seeds(text: str) -> list[int]:
    """`--seeds 5` (seeds 0..4) or `--seeds 0,1,2` (those): at least 2, none repeated, at most
    MAX_SEED_COUNT."""
    words = [w.strip() for w in text.split(",")]
    try:
        numbers = [int(w) for w in words]
    except ValueError:
        raise CompareError(
            f"--seeds {text!r}: give a count (--seeds 5: seeds 0..4) or a list (--seeds 0,1,2)."
        ) from None
    if len(numbers) == 1 and numbers[0] > MAX_SEED_COUNT:
        raise CompareError(
            f"--seeds {text}: {numbers[0]:,} seeds is more than {MAX_SEED_COUNT:,} (every arm "
            "trains once per seed); give a count such as --seeds 10."
        )
    seeds = list(range(numbers[0])) if len(numbers) == 1 else numbers
    if len(seeds) < 2:
        raise CompareError(
            f"--seeds {text}: a paired test needs at least 2 seeds; give --seeds 5 or more."
        )
    if any(s < 0 for s in seeds):
        raise CompareError(f"--seeds {text}: seeds are 0 or more; give e.g. --seeds 0,2.")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise CompareError(f"--seeds {text} repeats {repeated[0]}; list each seed once.")
    return seeds


def _settings(argument: str, where: str) -> dict[str, str]:
    """`key=value[,key=value]` as {key: text}; a comma inside a value (a list) is kept."""
    settings: dict[str, str] = {}
    for part in _NEXT_SETTING.split(argument):
        key, sep, text = part.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise CompareError(f"{where}: write key=value[,key=value], e.g. model.norm=rmsnorm.")
        if key in settings:
            raise CompareError(f"{where} sets {key} twice; keep one.")
        settings[key] = text.strip()
    return settings


def parse_arm(argument: str) -> tuple[str, dict[str, str]]:
    """`NAME:key=value[,key=value]` (or `NAME` alone: the config unchanged) as (name, texts)."""
    name, sep, rest = argument.partition(":")
    name = name.strip()
    if not _NAME.match(name):
        raise CompareError(
            f"--arm {argument!r}: an arm's name is letters, digits, _ and - (its folder in "
            "OUT), e.g. --arm rmsnorm:model.norm=rmsnorm."
        )
    return name, (_settings(rest, f"--arm {argument}") if sep and rest.strip() else {})


def _typed(config_spec: str, texts: dict[str, str], where: str) -> dict[str, Any]:
    """{key: typed value} of texts, with the settings the picked entries declare found."""
    config = spaces.base_config(config_spec)
    add_entry_settings(config, texts)
    values = {}
    for key, text in texts.items():
        if key == "seed":
            raise CompareError(f"{where} sets seed: the seeds are the comparison's; use --seeds.")
        try:
            values[key] = spaces.typed(config, key, text)
        except ValueError as error:
            raise CompareError(f"{where}: {error}") from None
    return values


def plan(
    config_spec: str,
    out: Path,
    sets: list[str],
    arm_arguments: list[str],
    baseline: str | None,
    seeds_text: str,
    aa: bool = False,
    eval_tokens: int = 0,
) -> Comparison:
    """The checked comparison: every arm's config complete and checked, no two arms alike;
    with `aa`, the config against itself on disjoint seeds (A/A: the false-positive rate)."""
    if out.exists() and not out.is_dir():
        raise CompareError(f"--out {out} is a file; name a folder for the comparison.")
    config_spec = config_file_of(config_spec)
    seeds = parse_seeds(seeds_text)
    try:
        spaces.base_config(config_spec)
    except ValueError as error:
        raise CompareError(str(error)) from None
    set_texts: dict[str, str] = {}
    for argument in sets:
        for key, text in _settings(argument, f"--set {argument}").items():
            if key in set_texts:
                raise CompareError(f"--set {key} is given twice; keep one.")
            set_texts[key] = text
    fixed = _typed(config_spec, set_texts, "--set")
    parsed = [parse_arm(argument) for argument in arm_arguments]
    if aa:
        if parsed or baseline is not None:
            raise CompareError(
                "--aa compares the config with itself on other seeds; drop --arm and --baseline."
            )
        if max(seeds) >= AA_SEED_OFFSET:
            raise CompareError(
                f"--seeds: with --aa each seed is below {AA_SEED_OFFSET} (the A/A arm trains "
                f"at seed S + {AA_SEED_OFFSET})."
            )
        arms = [
            Arm(BASELINE, {}, config_spec),
            Arm(AA_ARM, {}, config_spec, seed_offset=AA_SEED_OFFSET),
        ]
        return _checked(config_spec, out, fixed, arms, seeds, eval_tokens=eval_tokens)
    if baseline is None:
        parsed.insert(0, (BASELINE, {}))
    names = [name for name, _ in parsed]
    for name in names:
        if names.count(name) > 1:
            why = " (the unchanged config's name; give --baseline)" if name == BASELINE else ""
            raise CompareError(f"two arms are named {name}{why}; name each arm once.")
    if baseline is not None:
        if baseline not in names:
            raise CompareError(
                f"--baseline {baseline} names no --arm; the arms are {', '.join(names)}."
            )
        parsed.sort(key=lambda item: item[0] != baseline)  # the baseline first
    if len(parsed) < 2:
        raise CompareError(
            "a comparison needs two arms: give --arm NAME:key=value (the baseline is the "
            "config unchanged)."
        )
    arms = []
    for name, texts in parsed:
        where = f"--arm {name}"
        both = sorted(set(texts) & set(fixed))
        if both:
            raise CompareError(f"{where} and --set both set {both[0]}; keep it in one of them.")
        typed = _typed(config_spec, {**set_texts, **texts}, where)  # --set may pick an entry
        arms.append(Arm(name, {key: typed[key] for key in texts}, config_spec))
    return _checked(config_spec, out, fixed, arms, seeds, eval_tokens=eval_tokens)


def _checked(
    config_spec: str,
    out: Path,
    fixed: dict[str, Any],
    arms: list[Arm],
    seeds: list[int],
    notes: tuple[str, ...] = (),
    eval_tokens: int = 0,
) -> Comparison:
    """The comparison of `arms` (the baseline first): each arm's config completed and checked
    (at its smallest and largest seed), no two alike, each scored on the fixed eval set (at
    least `eval_tokens` tokens a pass, drawn with one key whatever the seed), and the identity
    a rerun must match."""
    configs, eval_values = {}, {}
    for arm in arms:
        values = {**fixed, **arm.overrides}
        try:
            config = check_experiment_config(spaces.config_with(arm.config_spec, values))
            if "eval_seed" not in values:  # the user's own eval key is kept
                values["eval_seed"] = EVAL_KEY
            per_batch = config.batch_size // config.grad_accum_steps * config.model.block_size
            wanted = -(-eval_tokens // per_batch)
            if "eval_batches" not in values and wanted > config.eval_batches:
                values["eval_batches"] = wanted
            for seed in sorted({min(seeds), max(seeds)}):  # every seed, before anything trains
                check_experiment_config(
                    spaces.config_with(arm.config_spec, {**values, "seed": seed + arm.seed_offset})
                )
            configs[arm.name] = check_experiment_config(spaces.config_with(arm.config_spec, values))
        except ValueError as error:
            if "config.seed=" in str(error):  # checked before anything trains
                raise CompareError(f"--seeds: {error} Give seeds the config accepts.") from None
            raise CompareError(f"--arm {arm.name} ({arm.described()}): {error}") from None
        eval_values[arm.name] = {
            k: v for k, v in values.items() if k not in fixed and k not in arm.overrides
        }
    flat = {name: flat_config(_plain(config.to_dict())) for name, config in configs.items()}
    for index, first in enumerate(arms):
        for second in arms[index + 1 :]:
            if flat[first.name] == flat[second.name] and not second.seed_offset:
                raise CompareError(
                    f"arms {first.name} and {second.name} differ in nothing (the same config "
                    "once defaults are filled in); drop one or change a setting."
                )
    plugins: dict[str, str] = {}
    for config in configs.values():
        plugins.update(user_module_digests(config))
    identity = {
        "config_file_sha256": spaces.file_digest(config_spec),
        "config": _plain(configs[arms[0].name].to_dict()),
        "set": _plain(fixed),
        "arms": {arm.name: _plain(arm.overrides) for arm in arms},
        "baseline": arms[0].name,
        "seeds": seeds,
        "plugins": plugins,
        "eval": eval_values,
    }
    own_files = {
        a.name: spaces.file_digest(a.config_spec) for a in arms if a.config_spec != config_spec
    }
    if own_files:  # an arm of its own config file (a sweep's winner)
        identity["arm_config_files_sha256"] = own_files
    return Comparison(
        config_spec=config_spec,
        out=out,
        fixed=fixed,
        arms=arms,
        seeds=seeds,
        num_steps=configs[arms[0].name].num_steps,
        identity=identity,
        tokens_per_step={
            name: config.batch_size * config.model.block_size for name, config in configs.items()
        },
        eval_tokens={
            name: config.eval_batches
            * config.batch_size
            // config.grad_accum_steps
            * config.model.block_size
            for name, config in configs.items()
        },
        eval_every={name: config.eval_every for name, config in configs.items()},
        eval_values=eval_values,
        notes=notes,
    )


# ----------------------------------------------------------------------------- a sweep's winner

SWEEP_WINNER = "sweep_best"  # the arm of a sweep's best trial (--from_sweep)


@dataclasses.dataclass(frozen=True)
class SweepWinner:
    """A sweep's best complete trial: its config (the sweep's base config and the values the
    trial set), its value of the sweep's objective, and every seed the sweep's trials used."""

    study: str
    trial: int
    base_spec: str
    values: dict[str, Any]  # the sweep's fixed settings (its --set) and the searched ones
    params: frozenset[str]  # the searched keys among them
    value: float
    objective: str
    tuned_seeds: frozenset[int]
    seed: int  # the best trial's own


def _trial_config(config_file: Path) -> tuple[str, dict[str, Any]]:
    """(BASE, VALUES) of a sweep trial's config.py (sweep.space.config_file_text's form), read
    as literals, not run."""
    found: dict[str, Any] = {}
    try:
        for node in ast.parse(config_file.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id in ("BASE", "VALUES"):
                    found[target.id] = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError) as error:
        raise CompareError(
            f"{config_file} cannot be read as a sweep trial's config ({type(error).__name__}: "
            f"{error}); rerun the sweep's best trial by hand with --config."
        ) from None
    if set(found) != {"BASE", "VALUES"}:
        raise CompareError(
            f"{config_file} is not a sweep trial's config (no BASE and VALUES); rerun the "
            "sweep's best trial by hand with --config."
        )
    return found["BASE"], found["VALUES"]


def sweep_winner(sweep_out: Path, study_name: str | None) -> SweepWinner:
    """The best trial of the study in SWEEP_OUT/study.db (the only one, or `study_name`)."""
    import optuna
    from optuna.trial import TrialState

    database = sweep_out / "study.db"
    if not database.is_file() or database.stat().st_size == 0:
        raise CompareError(
            f"--from_sweep {sweep_out} holds no study.db; name the --out folder of a "
            "minigpt-jax sweep."
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{database.resolve()}"
    try:
        names = optuna.get_all_study_names(storage)
    except Exception as error:  # another program's file, a damaged database
        raise CompareError(f"{database} cannot be read as a sweep's study ({error}).") from None
    if study_name is None:
        if len(names) != 1:
            raise CompareError(
                f"{database} holds studies {', '.join(names)}; say which with --study NAME."
            )
        study_name = names[0]
    elif study_name not in names:
        raise CompareError(
            f"--study {study_name}: {database} holds {', '.join(names) or 'no study'}."
        )
    study = optuna.load_study(study_name=study_name, storage=storage)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        raise CompareError(
            f"study {study_name!r} in {database} has no complete trial yet; run the sweep first."
        )
    best = study.best_trial
    base_seeds: dict[str, int] = {}
    tuned, best_config, best_seed = set(), None, 0
    for trial in study.get_trials(deepcopy=False):
        run_dir = trial.user_attrs.get("run_dir")
        if run_dir is None or not (sweep_out / run_dir / "config.py").is_file():
            continue
        base, values = _trial_config(sweep_out / run_dir / "config.py")
        if "seed" not in values and base not in base_seeds:
            base_seeds[base] = int(spaces.base_config(base).seed)
        tuned.add(int(values.get("seed", base_seeds.get(base, 0))))
        if trial.number == best.number:
            best_config = (base, values)
            best_seed = int(values.get("seed", base_seeds.get(base, 0)))
    if best_config is None:
        raise CompareError(
            f"the best trial ({best.number}) of study {study_name!r} has no config.py in "
            f"{sweep_out}; rerun it by hand with --config."
        )
    base, values = best_config
    if not Path(base.partition(":")[0]).is_file():
        raise CompareError(
            f"the sweep's base config {base} is gone; restore it, or rerun the best trial by "
            "hand with --config."
        )
    return SweepWinner(
        study=study_name,
        trial=best.number,
        base_spec=base,
        values={k: v for k, v in values.items() if k != "seed"},
        params=frozenset(best.params),
        value=float(best.value),
        objective=study.user_attrs.get("objective", "best val loss"),
        tuned_seeds=frozenset(tuned),
        seed=best_seed,
    )


def fresh_seeds(text: str, tuned: frozenset[int]) -> list[int]:
    """`--seeds N`: the N smallest seeds the sweep did not tune on; a list: refused if it holds
    one it did."""
    seeds = parse_seeds(text)
    if "," not in text:
        seeds, candidate = [], 0
        while len(seeds) < int(text):
            if candidate not in tuned:
                seeds.append(candidate)
            candidate += 1
        return seeds
    used = sorted(set(seeds) & tuned)
    if used:
        raise CompareError(
            f"--seeds {text}: seed {used[0]} is one the sweep tuned on (it used "
            f"{', '.join(map(str, sorted(tuned)))}); a winner is rechecked on fresh seeds."
        )
    return seeds


def plan_from_sweep(
    sweep_out: Path,
    study_name: str | None,
    baseline_spec: str,
    out: Path,
    sets: list[str],
    seeds_text: str,
    eval_tokens: int = 0,
) -> Comparison:
    """The comparison of a sweep's best trial (arm `sweep_best`) with `baseline_spec` (arm
    `baseline`) on seeds the sweep did not tune on; --set applies to both."""
    if out.exists() and not out.is_dir():
        raise CompareError(f"--out {out} is a file; name a folder for the comparison.")
    baseline_spec = config_file_of(baseline_spec)
    try:
        spaces.base_config(baseline_spec)
    except ValueError as error:
        raise CompareError(f"--baseline: {error}") from None
    parse_seeds(seeds_text)  # its errors before the sweep's are read
    winner = sweep_winner(sweep_out, study_name)
    seeds = fresh_seeds(seeds_text, winner.tuned_seeds)
    set_texts: dict[str, str] = {}
    for argument in sets:
        set_texts.update(_settings(argument, f"--set {argument}"))
    fixed = _typed(baseline_spec, set_texts, "--set")
    clash = sorted(k for k in set(fixed) & winner.params if fixed[k] != winner.values[k])
    if clash:
        raise CompareError(
            f"--set {clash[0]}: the sweep chose {winner.values[clash[0]]!r} for it; a recheck "
            "keeps the winner's values."
        )
    # The sweep's own fixed settings (its --set: a shorter run, another corpus) go to both
    # arms, so the baseline trains as the sweep's trials did; --set may change them for both.
    sweep_fixed = {
        k: v for k, v in winner.values.items() if k not in winner.params and k not in fixed
    }
    searched = {k: v for k, v in winner.values.items() if k in winner.params}
    about = f"trial {winner.trial} of sweep {sweep_out} (study {winner.study})"
    arms = [
        Arm(BASELINE, sweep_fixed, baseline_spec, about=baseline_spec),
        Arm(SWEEP_WINNER, {**sweep_fixed, **searched}, winner.base_spec, about=about),
    ]
    tuned = ", ".join(map(str, sorted(winner.tuned_seeds)))
    notes = (
        f"{SWEEP_WINNER}: {about}, {winner.objective} {winner.value:.4f} in the sweep, whose "
        f"trials used seed{'s' * (len(winner.tuned_seeds) != 1)} {tuned}; rerun here on fresh "
        f"seeds {', '.join(map(str, seeds))}; both arms also at its seed {winner.seed} (the "
        "paired winner's-curse check).",
    )
    comparison = _checked(baseline_spec, out, fixed, arms, seeds, notes, eval_tokens)
    comparison.tuned_seeds = [winner.seed]
    comparison.identity["tuned_seeds"] = [winner.seed]
    comparison.identity["sweep"] = {"out": str(sweep_out.resolve()), "study": winner.study}
    comparison.sweep_value = (winner.objective, winner.value)
    return comparison


# ----------------------------------------------------------------------------- code version

_REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(_REPO), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def code_version() -> dict[str, str]:
    """{"minigpt_jax": its version, "commit": the checkout's commit ("+changes" when the
    library or the apps differ from it; "" outside a git checkout)}."""
    from minigpt_jax import __version__

    commit = _git("rev-parse", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no", "--", "minigpt_jax",
                       "minigpt_apps"):  # fmt: skip
        commit += "+changes"
    return {"minigpt_jax": __version__, "commit": commit}


def _plain(value: Any) -> Any:
    """`value` as JSON data (a value JSON has no word for: its repr)."""
    return json.loads(json.dumps(value, default=repr))


def differences(saved: dict, mine: dict) -> str:
    """Words for what differs between two identities."""
    words = []
    if saved.get("config_file_sha256") != mine.get("config_file_sha256"):
        words.append("the --config file's content")
    for name, flag in (("set", "--set"), ("baseline", "--baseline"), ("seeds", "--seeds")):
        if saved.get(name) != mine.get(name):
            words.append(f"{flag} ({saved.get(name)!r} then, {mine.get(name)!r} now)")
    old, new = saved.get("arms", {}), mine.get("arms", {})
    if list(old) != list(new):
        words.append(f"the arms ({', '.join(old)} then, {', '.join(new)} now)")
    for name in old:
        if name in new and old[name] != new[name]:
            words.append(f"--arm {name} ({old[name]!r} then, {new[name]!r} now)")
    if saved.get("plugins") != mine.get("plugins"):
        words.append("the source of plug-in modules")
    if saved.get("eval") != mine.get("eval"):
        words.append(f"the eval set ({saved.get('eval')!r} then, {mine.get('eval')!r} now)")
    if not words:
        before, after = flat_config(saved.get("config", {})), flat_config(mine.get("config", {}))
        changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
        if changed:  # the config file's imports changed what it returns
            words.append(f"the config ({', '.join(f'config.{k}' for k in changed)})")
    return "; ".join(words) or "its settings"


def _grows(saved: dict, mine: dict) -> bool:
    """Whether `mine` is `saved` with seeds or arms added (the old ones unchanged)."""
    rest = ("seeds", "arms", "eval")
    if {k: v for k, v in saved.items() if k not in rest} != {
        k: v for k, v in mine.items() if k not in rest
    }:
        return False
    old_arms, new_arms = saved.get("arms", {}), mine.get("arms", {})
    return (
        set(saved.get("seeds", [])) <= set(mine.get("seeds", []))
        and all(new_arms.get(name) == value for name, value in old_arms.items())
        and all(mine.get("eval", {}).get(a) == saved.get("eval", {}).get(a) for a in old_arms)
    )


def check_out(comparison: Comparison, code: dict[str, str]) -> str:
    """ "new" (OUT is new or empty), "resume" (OUT holds this comparison) or "grow" (OUT holds it
    with fewer seeds or arms: the new ones train, the old ones are read); refuses OUT holding
    another comparison, one trained by another code version, or a folder of other things."""
    out = comparison.out
    path = out / IDENTITY_FILE
    if not path.exists():
        if out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir()):
            raise CompareError(
                f"--out {out} is a folder of other things (no {IDENTITY_FILE}); give a new or "
                "empty folder."
            )
        return "new"
    try:
        document = json.loads(path.read_text())
        saved = document["identity"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CompareError(
            f"{path} is unreadable ({type(error).__name__}); give another --out."
        ) from None
    saved_code = document.get("code")
    if saved_code != code:
        then = "an unrecorded version" if saved_code is None else _code_words(saved_code)
        raise CompareError(
            f"--out {out} was trained by {then} and this is {_code_words(code)}: a resume would "
            "mix the two; rerun with that code, or give another --out."
        )
    if saved == comparison.identity:
        return "resume"
    if _grows(saved, comparison.identity):
        return "grow"
    raise CompareError(
        f"--out {out} holds another comparison: {differences(saved, comparison.identity)}; "
        f"rerun its own command (in {path}) to resume it, or give another --out."
    )


def _code_words(code: dict[str, str]) -> str:
    return f"minigpt_jax {code.get('minigpt_jax')} at commit {code.get('commit') or 'unknown'}"


def earlier_commands(comparison: Comparison) -> list[dict]:
    """The commands (and identities) a growth of OUT replaced, oldest first."""
    path = comparison.out / IDENTITY_FILE
    return json.loads(path.read_text()).get("earlier", []) if path.exists() else []


def write_identity(comparison: Comparison, command: list[str], code: dict[str, str]) -> None:
    """OUT/compare.json: the identity, the code version, the command that made it (to rerun
    it) and the earlier commands a growth replaced."""
    path = comparison.out / IDENTITY_FILE
    earlier = []
    if path.exists():
        before = json.loads(path.read_text())
        earlier = [*before.get("earlier", []), {k: before[k] for k in ("command", "identity")}]
    document = {"command": command, "identity": comparison.identity, "code": code}
    text = json.dumps({**document, "earlier": earlier} if earlier else document, indent=1)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
