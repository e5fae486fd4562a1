"""Every setting declared once: name, default, one-line doc, allowed values and kind.

A setting is a field of a typed group declared with `setting(...)`: `GPTConfig` (the model
group, minigpt_jax.model.config) and the groups below (loop settings at the top level, `optim`,
`data`, `mesh`, `loss`). Everything else derives from these declarations: the keys a config may
hold and the "did you mean" of a typo (`config_dict`), the range checks, what may change on
resume (`train.resume`), what a fine-tune may change and what GPT-2's layout needs (`gpt2`), and
the defaults a config file starts from, so `configs/*.py` state only what differs.

Kinds:
  MODEL        the model's shape and math: a resumed run must match it
  SPEED        how the same run is computed (kernels, chunking, mesh): free to change on resume
  TRAJECTORY   which batches and updates a run sees: refused on resume unless
               --allow_resume_changes
  BOOKKEEPING  logging, evaluation and checkpoint cadence, the step budget: free

Next to a leaf: it imports only `settings.registry` (which imports nothing of minigpt_jax), for
the table of registries whose picked entries bring options; a `choices` registry is any
container.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Container, Mapping
from typing import Any, ClassVar

from minigpt_jax.settings.registry import REGISTRIES

MODEL, SPEED, TRAJECTORY, BOOKKEEPING = "model", "speed", "trajectory", "bookkeeping"
# The value of a setting that lets the code choose (per backend, per CPU, per optimizer).
AUTO = "auto"
KINDS = (MODEL, SPEED, TRAJECTORY, BOOKKEEPING)

_NO_VALUE = object()
# Steps are counted in int32 on the device (TrainState.step, the schedule): step counts, and
# sizes multiplied into them, stay below it.
STEP_LIMIT = 2**31
_STEPS = f"a positive integer below 2**31 = {STEP_LIMIT} (the step counter is int32)"
# Learning rates and decay at or above it only diverge (1e30 overflowed float32 in numpy).
MAX_LR = 100.0


@dataclasses.dataclass(frozen=True)
class Setting:
    """The declaration of one setting (a dataclass field's metadata["setting"])."""

    doc: str
    kind: str
    type: type
    low: float | None = None  # lowest allowed value (inclusive unless low_open)
    low_open: bool = False
    high: float | None = None  # values must stay below it
    choices: Container | None = None  # a tuple, or a registry (names and module:attr)
    nullable: bool = False  # None is allowed (a placeholder to fill in, e.g. data.path)
    requirement: str | None = None  # words for the rule, where the generic ones don't fit
    finetune_free: bool = False  # init_from may differ in it (model_files.shape_mismatch)
    gpt2: Any = _NO_VALUE  # the value GPT-2's layout needs to export (gpt2.py)
    # A rule across settings of the group: (value, {name: value} of the group) -> the problem
    # in words ("must divide n_head=4"), or None; checked after every single value passed.
    relation: Callable[[Any, Mapping[str, Any]], str | None] | None = None

    @property
    def needs_gpt2_value(self) -> bool:
        return self.gpt2 is not _NO_VALUE

    def problem(self, where: str, value: Any) -> str | None:
        """None when `value` is allowed, else the message naming `where` and the rule."""
        if value is None and self.nullable:
            return None
        if self.choices is not None:
            if isinstance(value, str) and value in self.choices:
                return None
            check = getattr(self.choices, "check", None)
            if check is not None:
                check(value)  # any registry's own error: its entries (and the module:attr form)
            return f"{where}={value!r} is unknown; allowed: {list(self.choices)}."
        if not _has_type(value, self.type):
            words = self.requirement or _type_words(self.type)
            if self.type is int and self.low == 1 and not self.requirement:
                words = self._positive_words()
            return f"{where} must be {words}, got {value!r}."
        if self.type in (int, float) and not self._in_range(value):
            if self.requirement:
                return f"{where} must be {self.requirement}, got {value!r}."
            if self.type is int and self.low == 1:
                return f"{where} must be {self._positive_words()}, got {value!r}."
            return f"{where}={value!r} is out of range: it must be {self._range_words()}."
        return None

    def _positive_words(self) -> str:
        return "a positive integer" + ("" if self.high is None else f" below {self.high}")

    def _in_range(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value < self.high

    def _range_words(self) -> str:
        words = "an integer" if self.type is int else "a finite number"
        if self.low is not None:
            words += f" {'>' if self.low_open else '>='} {self.low}"
        if self.high is not None:
            words += f"{' and' if self.low is not None else ''} < {self.high}"
        return words


def _has_type(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _type_words(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[kind]


def setting(default: Any, doc: str, kind: str, **rules: Any) -> Any:
    """A dataclass field declaring one setting: its default, doc, kind and rules (`Setting`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown setting kind {kind!r}; kinds: {KINDS}.")
    kind_type = rules.pop("type", None) or type(default)
    declared = Setting(doc=doc, kind=kind, type=kind_type, **rules)
    return dataclasses.field(default=default, metadata={"setting": declared})


def declarations(group: type) -> dict[str, Setting]:
    """{name: Setting} of a settings dataclass, in declaration order."""
    return {
        f.name: f.metadata["setting"] for f in dataclasses.fields(group) if "setting" in f.metadata
    }


def defaults(group: type) -> dict[str, Any]:
    """{name: default} of a settings dataclass."""
    return {f.name: f.default for f in dataclasses.fields(group) if "setting" in f.metadata}


def check_values(group: type, values: dict[str, Any], where: str) -> None:
    """Raises ValueError for the first value of `values` its declaration does not allow."""
    specs = declarations(group)
    for name, value in values.items():
        if name in specs:
            message = specs[name].problem(f"{where}.{name}", value)
            if message:
                raise ValueError(message)
    for name, value in values.items():
        relation = specs[name].relation if name in specs else None
        message = relation(value, values) if relation is not None else None
        if message:
            raise ValueError(f"{where}.{name}={value!r} {message}.")


# ----------------------------------------------------------------------------- typed groups


def make_options(options: type, values: Mapping[str, Any], where: str) -> Any:
    """The object of `options` (a dataclass of settings, an entry's `declares`): the values of
    `values` its fields name, its defaults for the rest. Raises ValueError naming `where` and
    the first value a rule refuses."""
    names = {field.name for field in dataclasses.fields(options)}
    made = options(**{name: value for name, value in values.items() if name in names})
    check_values(options, {name: getattr(made, name) for name in names}, where)
    return made


def options_of(group: Any, entry: Any) -> Any:
    """The typed options object of `entry` (an entry that `declares` settings, or its options
    dataclass itself) in `group`, the group its config key belongs to (`cfg`, `optim`,
    `config.hooks`, `data`, ...). A typed Group built it once, with the group; a ConfigDict group
    (a script's `config.optim`) builds it now from its values. Raises LookupError when the
    group's config does not pick the entry, TypeError when the entry declares no settings."""
    options = getattr(entry, "options_class", None) or entry
    if not (isinstance(options, type) and declarations(options)):
        raise TypeError(
            f"{getattr(entry, '__name__', entry)!r} declares no settings: give it some with "
            f"registry.declares(name=setting(...)) or declares(MyOptions)."
        )
    if not isinstance(group, Group):
        names = [name for name in declarations(options) if name in group]
        return make_options(options, {name: group[name] for name in names}, "config")
    built = group.__dict__.get("_entry_options", {})
    if options not in built:
        picked = sorted(cls.__name__ for cls in built) or "none"
        raise LookupError(
            f"{type(group).__name__} holds no {options.__name__}: its config does not pick the "
            f"entry that declares it (the picked entries' options: {picked}); an entry's "
            f"options exist where the config key of its registry picks it."
        )
    return built[options]


@dataclasses.dataclass(frozen=True)
class Group:
    """A typed group of settings: its declared fields, and the settings its picked entries
    declare (registry.declares) as sorted (name, value) pairs, the flat shape a config file,
    the command line and a checkpoint hold. Built once, it makes each picked entry's typed
    options object from those pairs (`options_of(group, entry)` hands it to the entry). The
    groups below, built once at the edge (minigpt_jax.typed_config), are what a run reads."""

    # The group's config key ("optim", "model"; "" for the top level): the registries picked by
    # keys under it (`REGISTRIES`) bring their entries' options here.
    config_group: ClassVar[str] = ""
    entry_settings: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        pairs = tuple(sorted((str(k), v) for k, v in self.entry_settings))
        object.__setattr__(self, "entry_settings", pairs)  # a checkpoint's JSON holds lists
        object.__setattr__(self, "_entry_options", self._build_entry_options())

    def __getstate__(self) -> dict[str, Any]:
        """A pickle holds the settings, not the options objects (an entry's options class may
        be one `declares` made, which pickle cannot name): unpickling builds them again."""
        return {k: v for k, v in self.__dict__.items() if k != "_entry_options"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "_entry_options", self._build_entry_options())

    def _build_entry_options(self) -> dict[type, Any]:
        """{options class: its object} of each picked entry that declares settings: the
        entry_settings pairs over the class's defaults, each checked by its rule."""
        values = dict(self.entry_settings)
        built: dict[type, Any] = {}
        for config_key in REGISTRIES:  # a fixed index: an import here adds no registry
            group, _, field_name = config_key.rpartition(".")
            if group != self.config_group or field_name not in self.__dict__:
                continue
            registry = REGISTRIES[config_key]
            for key in registry.keys_in(self.__dict__[field_name]):
                try:
                    classes = registry.options_classes_of(key)
                except Exception:  # noqa: BLE001 (an unresolvable pick: the checks name it)
                    continue
                for options in classes:
                    if options not in built:
                        built[options] = make_options(options, values, type(self).__name__)
        return built

    @classmethod
    def from_values(cls, values: Mapping[str, Any], skip: Container = ()) -> Group:
        """The group of `values` (complete and checked): its declared settings as fields, the
        others (those its picked entries declare), but the names in `skip`, as entry_settings."""
        declared = declarations(cls)
        own = {name: value for name, value in values.items() if name in declared}
        others = [(k, v) for k, v in values.items() if k not in declared and k not in skip]
        return cls(**own, entry_settings=tuple(others))

    def __getattr__(self, name: str) -> Any:
        """Only called for a name that is no attribute: an entry's own setting is not one (it
        is read from the entry's options object), so the error says where it is."""
        if name.startswith("_") or name not in self.declared_entry_settings():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        group = "cfg" if type(self).__name__ == "GPTConfig" else type(self).__name__.lower()
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r}: it is a setting a picked entry "
            f"declares, read from that entry's options object: `options_of({group}, entry)"
            f".{name}` (from minigpt_jax.settings import options_of)."
        )

    def declared_entry_settings(self) -> dict[str, Any]:
        """{name: dataclasses.Field of `setting`} that the entries this group picks declare."""
        return {
            field.name: field
            for options in self.__dict__.get("_entry_options", {})
            for field in dataclasses.fields(options)
        }

    def flat_values(self) -> dict[str, Any]:
        """{name: value} of every setting of the group, declared ones and the picked entries'
        own (their options' values), flat as a config file holds them."""
        values = self.to_dict()
        for made in self.__dict__.get("_entry_options", {}).values():
            for field in dataclasses.fields(made):
                values.setdefault(field.name, getattr(made, field.name))
        return values

    def to_dict(self) -> dict[str, Any]:
        """{name: value} of the declared settings, then the entries' own: the group as a run
        config (and a checkpoint's record of it) holds it."""
        values = {name: getattr(self, name) for name in declarations(type(self))}
        values.update(self.entry_settings)
        return values


# ----------------------------------------------------------------------------- loop settings


@dataclasses.dataclass(frozen=True)
class Loop(Group):
    """The top level of a run config: batch, step budget and cadences."""

    seed: int = setting(
        0, "one key, split into init, data and dropout keys", TRAJECTORY, low=0, high=2**31
    )
    batch_size: int = setting(
        16,
        "sequences per optimizer step (all micro-batches, all devices)",
        TRAJECTORY,
        low=1,
        high=STEP_LIMIT,
    )
    seq_len_schedule: str = setting(
        "",
        "tokens per row by step, 'length:until_step,...[,length]' ('16:100,32:200': 16 until "
        "step 100, 32 until 200, then model.block_size); '' = block_size throughout "
        "(settings/shape_schedule.py)",
        TRAJECTORY,
        type=str,
    )
    batch_size_schedule: str = setting(
        "",
        "sequences per step by step, 'size:until_step,...[,size]' as seq_len_schedule, ramping "
        "up to batch_size; '' = batch_size throughout",
        TRAJECTORY,
        type=str,
    )
    grad_accum_steps: int = setting(
        1,
        "micro-batches of batch_size / grad_accum_steps per step",
        SPEED,
        low=1,
        high=STEP_LIMIT,
    )
    num_steps: int = setting(
        1500,
        "optimizer steps in the whole run",
        BOOKKEEPING,
        low=1,
        high=STEP_LIMIT,
        requirement=_STEPS,
    )
    steps_per_call: int = setting(
        10,
        "optimizer steps per compiled call (a lax.scan over batches; metrics stay per step)",
        SPEED,
        low=1,
        high=STEP_LIMIT,
        requirement=_STEPS,
    )
    eval_every: int = setting(
        250,
        "steps between validation passes (a multiple of steps_per_call)",
        BOOKKEEPING,
        low=1,
        high=STEP_LIMIT,
        requirement=_STEPS,
    )
    eval_batches: int = setting(
        20,
        "validation batches (of one micro-batch each) per pass, fixed",
        BOOKKEEPING,
        low=1,
        high=STEP_LIMIT,
    )
    eval_seed: int = setting(
        -1,
        "the key the fixed eval batches are drawn with (-1: the run's seed); one value scores "
        "runs of different seeds on the same tokens",
        BOOKKEEPING,
        low=-1,
        high=2**31,
    )
    step_metrics: str = setting(
        "",
        "comma-separated per-step metrics of the gradients and updates, logged beside the "
        "loss: grad_norm_by_tag | update_ratio (step_metrics.py) or module:attr",
        BOOKKEEPING,
        type=str,
    )
    log_every: int = setting(
        10,
        "steps between progress-bar and TensorBoard updates",
        BOOKKEEPING,
        low=1,
        high=STEP_LIMIT,
        requirement=_STEPS,
    )
    checkpoint_every: int = setting(
        250,
        "steps between checkpoints (a multiple of steps_per_call)",
        BOOKKEEPING,
        low=1,
        high=STEP_LIMIT,
        requirement=_STEPS,
    )
    keep_checkpoints: int = setting(
        3,
        "latest checkpoints kept; the best by val loss is kept apart",
        BOOKKEEPING,
        low=1,
        high=STEP_LIMIT,
    )
    init_from: str = setting(
        "",
        "fine-tune from a Hugging Face GPT-2 directory or a run's workdir ('' = from scratch); "
        "its tokenizer replaces data's, the model group must match it (a plug-in may add "
        "parameters, which start from their init: finetune.py)",
        BOOKKEEPING,
    )


# ----------------------------------------------------------------------------- groups


def parse_tag_factors(text: str) -> dict[str, float]:
    """{tag: factor} of optim.lr_multipliers' "tag=factor,tag=factor" ("" is {}); raises
    ValueError naming the part that is not a tag=finite non-negative number pair."""
    factors: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        tag, equals, number = part.partition("=")
        try:
            factor = float(number)
        except ValueError:
            factor = math.nan
        if not equals or not tag.strip() or not (math.isfinite(factor) and factor >= 0):
            raise ValueError(
                f"optim.lr_multipliers={text!r}: {part!r} is not tag=factor (a parameter tag, "
                f"then a finite number >= 0), e.g. 'embedding=10,head=0.5'."
            )
        factors[tag.strip()] = factor
    return factors


class TagFactors:
    """The allowed values of optim.lr_multipliers, checked by `parse_tag_factors`."""

    def __contains__(self, value: object) -> bool:
        try:
            return isinstance(value, str) and parse_tag_factors(value) is not None
        except ValueError:
            return False

    def __iter__(self):
        return iter(("", "tag=factor,..."))

    def check(self, value: Any) -> None:
        if not isinstance(value, str):
            raise ValueError(f"optim.lr_multipliers must be a string, got {value!r}.")
        parse_tag_factors(value)


# The name optim.frozen_tags gives the parameters that declare no tag (norm scales, undeclared
# vectors), so that a list of tags can freeze a whole model.
UNTAGGED = "untagged"


def parse_frozen_tags(text: str) -> tuple[str, ...]:
    """The tags of optim.frozen_tags' "tag,tag" ("" is ()); raises ValueError naming a part that
    is no tag name."""
    tags = tuple(part.strip() for part in text.split(",") if part.strip())
    for tag in tags:
        if not all(char.isalnum() or char in "_-." for char in tag):
            raise ValueError(
                f"optim.frozen_tags={text!r}: {tag!r} is not a tag name (letters, digits, _ - .); "
                f"give tags separated by commas, e.g. 'embedding,attention,mlp,{UNTAGGED}'."
            )
    return tags


class FrozenTags:
    """The allowed values of optim.frozen_tags, checked by `parse_frozen_tags`."""

    def __contains__(self, value: object) -> bool:
        try:
            return isinstance(value, str) and parse_frozen_tags(value) is not None
        except ValueError:
            return False

    def __iter__(self):
        return iter(("", "tag,..."))

    def check(self, value: Any) -> None:
        if not isinstance(value, str):
            raise ValueError(f"optim.frozen_tags must be a string, got {value!r}.")
        parse_frozen_tags(value)


@dataclasses.dataclass(frozen=True)
class Optim(Group):
    """config.optim: the optimizer, its learning-rate schedule and gradient clipping."""

    config_group: ClassVar[str] = "optim"

    lr: float = setting(
        1e-3,
        "peak learning rate after warmup (0: a run that only evaluates)",
        TRAJECTORY,
        low=0.0,
        high=MAX_LR,
    )
    min_lr: float = setting(
        1e-4, "the schedule's end, reached at num_steps", TRAJECTORY, low=0.0, high=MAX_LR
    )
    warmup_steps: int = setting(
        100,
        "linear warmup from 0",
        TRAJECTORY,
        low=0,
        high=STEP_LIMIT,
    )
    b1: float = setting(0.9, "Adam's first-moment decay", TRAJECTORY, low=0.0, high=1.0)
    b2: float = setting(0.99, "Adam's second-moment decay", TRAJECTORY, low=0.0, high=1.0)
    eps: float = setting(1e-8, "Adam's epsilon", TRAJECTORY, low=0.0, low_open=True)
    weight_decay: float = setting(
        0.1,
        "decoupled decay of kernels and embedding tables, not biases or norms",
        TRAJECTORY,
        low=0.0,
        high=MAX_LR,
    )
    grad_clip: float = setting(
        1.0, "global-norm clipping threshold", TRAJECTORY, low=0.0, low_open=True
    )
    name: str = setting(
        "adamw",
        "the optimizer: a key of optimizers.OPTIMIZERS, or module:attr of your own",
        TRAJECTORY,
        type=str,
    )
    schedule: str = setting(
        "cosine",
        "the learning-rate schedule: cosine | constant | wsd, a key of optimizers.SCHEDULES, "
        "or module:attr",
        TRAJECTORY,
        type=str,
    )
    decay_fraction: float = setting(
        0.2,
        "wsd: the last fraction of num_steps decays to min_lr",
        TRAJECTORY,
        low=0.0,
        high=1.0,
    )
    muon_lr: float = setting(
        0.02,
        "muon: the learning rate of the blocks' matrices (AdamW's stays lr)",
        TRAJECTORY,
        low=0.0,
        high=MAX_LR,
    )
    muon_momentum: float = setting(
        0.95, "muon: Nesterov momentum of the blocks' matrices", TRAJECTORY, low=0.0, high=1.0
    )
    # bfloat16 operands with float32 sums in Muon's Newton-Schulz dots; the momentum and the
    # weights stay float32. The update is within a stated, tested tolerance of float32's
    # (tests/test_registry.py); "auto" resolves when the optimizer is built, like the training
    # step's model.matmul_dtype (minigpt_jax.model.speed.backend.bf16_matmuls_pay).
    muon_ns_dtype: str = setting(
        "auto",
        "muon: Newton-Schulz dot operands: auto (bfloat16 on CPUs with AVX512-BF16 or AMX) | "
        "float32 | bfloat16 (float32 sums, momentum and weights)",
        SPEED,
        choices=(AUTO, "float32", "bfloat16"),
    )
    eval_params: str = setting(
        "auto",
        "the params evaluation, best/, sampling and export use: auto (the optimizer's own: "
        "schedule-free's x, else the trained ones) | params | ema (optim.ema_decay) | "
        "module:attr (optimizers.EVAL_PARAMS)",
        TRAJECTORY,
        type=str,
    )
    # Per-group rates (muP's per-group learning rates, a frozen group at 0) by the tags the
    # parameters declare where they are created (param_meta.declare(tags=...)), never by name.
    lr_multipliers: str = setting(
        "",
        "tag=factor,...: each update x the factors of its parameter's tags (embedding, "
        "attention, mlp, head, or a plug-in's own); '': none",
        TRAJECTORY,
        choices=TagFactors(),
    )
    # Fine-tuning's frozen base (LoRA): no update at all, exactly zero (optimizer_wrappers.
    # freeze_tags), where lr_multipliers' factor 0 still keeps their gradients in the clip's norm.
    frozen_tags: str = setting(
        "",
        f"tag,...: parameters carrying any of these tags (embedding, attention, mlp, head, a "
        f"plug-in's own, or {UNTAGGED}: those declaring none) get no update, weight decay "
        f"included, and no share of the gradient clip's norm; '': none",
        TRAJECTORY,
        choices=FrozenTags(),
    )
    gradient: str = setting(
        "plain",
        "the gradient each step applies: plain (one, at the params) | module:attr, a function "
        "(value_and_grad, params, optim) -> ((loss, aux), grads), e.g. SAM's second gradient "
        "(train/gradients.py GRADIENTS)",
        TRAJECTORY,
        type=str,
    )


@dataclasses.dataclass(frozen=True)
class Data(Group):
    """config.data: the corpus, its tokenizer and split, and how a run holds it. The keys that
    pick a part (corpus, file_format, tokenizer, format) name an entry of their registry
    (data.sources.CORPORA, data.corpus.FILE_FORMATS, data.tokenizers.TOKENIZERS,
    data.formats.DATA_FORMATS) or module:attr."""

    config_group: ClassVar[str] = "data"

    corpus: str = setting(
        "pydoc",
        "pydoc (embedded) | shakespeare | text (data.path), or module:attr",
        TRAJECTORY,
        type=str,
    )
    path: str | None = setting(
        None,
        "a .txt/.jsonl/.csv/.parquet file, a directory or a glob",
        TRAJECTORY,
        type=str,
        nullable=True,
    )
    file_format: str = setting(
        "",
        "'': each file by its suffix, others refused; txt | jsonl | csv | parquet: also files "
        "of any other suffix; module:attr: the files of its suffixes (any other, without)",
        TRAJECTORY,
        type=str,
    )
    tokenizer: str = setting("bpe", "char | bpe (byte-level), or module:attr", TRAJECTORY, type=str)
    vocab_size: int = setting(
        512,
        "BPE vocabulary (256 bytes + merges); char ignores it",
        TRAJECTORY,
        low=1,
        high=1 << 24,
    )
    val_fraction: float = setting(
        0.1,
        "the last fraction of the tokens is the validation split",
        TRAJECTORY,
        low=0.0,
        low_open=True,
        high=1.0,
    )
    format: str = setting(
        "memory",
        "memory: read, encoded and held in RAM (workdir/tokens.npy); shards: streamed into "
        "memory-mapped token shards, any size",
        TRAJECTORY,
        type=str,
    )
    shards_dir: str | None = setting(
        None, "shards: their folder (default workdir/shards)", TRAJECTORY, type=str, nullable=True
    )
    text_field: str = setting(
        "text",
        "the field of a .jsonl line, the column of a .csv/.parquet file, with the text",
        TRAJECTORY,
    )
    # At least 1,024 tokens a file, and at most MAX_SHARD_FILES files (data.shards.prepare).
    shard_tokens: int = setting(
        1 << 27,
        "shards: tokens per shard file",
        TRAJECTORY,
        low=1024,
        high=STEP_LIMIT,
        requirement=f"an integer from 1024 to {STEP_LIMIT - 1} (2**31 - 1) tokens per file",
    )
    tokenizer_sample_bytes: int = setting(
        1 << 26, "shards: text a BPE tokenizer is trained on (read into memory)", TRAJECTORY,
        low=1, high=1 << 32,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Mesh(Group):
    """config.mesh: the device mesh; -1 is all remaining devices (minigpt_jax/sharding.py)."""

    config_group: ClassVar[str] = "mesh"

    data: int = setting(-1, "devices the batch splits over", SPEED, low=-1)
    fsdp: int = setting(1, "devices params and batch split over (ZeRO-3)", SPEED, low=-1)
    tensor: int = setting(1, "devices heads, MLP units and vocabulary split over", SPEED, low=-1)


@dataclasses.dataclass(frozen=True)
class Loss(Group):
    """config.loss: terms added to the next-token cross-entropy (model/loss_terms.py)."""

    config_group: ClassVar[str] = "loss"

    terms: str = setting(
        "",
        "comma-separated name[=weight] of loss_terms.LOSS_TERMS or module:attr, e.g. "
        "'z_loss=1e-4'; each term's mean is logged beside the loss",
        TRAJECTORY,
    )


@dataclasses.dataclass(frozen=True)
class Eval(Group):
    """config.eval: what every evaluation computes besides the losses."""

    config_group: ClassVar[str] = "eval"

    metrics: str = setting(
        "",
        "comma-separated metrics of eval_metrics.METRICS or module:attr, e.g. "
        "'attn_entropy,embed_norm', logged as val_<name> and eval_train_<name>",
        BOOKKEEPING,
    )


# The groups of a run config besides `model` (GPTConfig, minigpt_jax.model.config), by key.
@dataclasses.dataclass(frozen=True)
class Hooks(Group):
    """config.hooks: code the training loop calls at steps, evaluations and checkpoints
    (minigpt_jax/train/hooks.py); the picked hooks' own settings join this group."""

    config_group: ClassVar[str] = "hooks"

    names: str = setting(
        "",
        "comma-separated hooks: samples (hooks.py) or module:attr; '': none",
        BOOKKEEPING,
        type=str,
    )


GROUPS: dict[str, type] = {
    "optim": Optim,
    "data": Data,
    "mesh": Mesh,
    "loss": Loss,
    "eval": Eval,
    "hooks": Hooks,
}
