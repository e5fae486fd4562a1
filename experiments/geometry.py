"""Experiment 10: geometry of a trained token table: neighbours, PCA, and groups of characters.

    python -m experiments.geometry --outdir results/geometry --data ../shared/data
    python -m experiments.geometry --outdir results/geometry --workdir runs/sc   # reuse a run
    python -m experiments.geometry --outdir results/geometry_gpt2 --pretrained path/to/gpt2

Trains character-level Tiny Shakespeare (configs/shakespeare_char.py, default 300 steps) unless
--workdir holds a checkpoint, then reads the token table params['embed']['tok']['embedding']
(V×D). For a few characters it lists the nearest rows by cosine similarity, plots the table's
first two principal components with labels, and asks whether characters used in similar
contexts end up close: mean cosine similarity within groups (vowels, consonants, upper case,
punctuation, digits) against between groups, and how often a character's nearest grouped
neighbour is in its own group. The control is the same statistic on the run's own initial table
(rebuilt from its seed), where any structure is chance. After 300 steps vowels, capitals and
punctuation form groups (90% of nearest neighbours in the own group; chance 31%, init 21%), and
the main axis is frequency (|corr(PC1, log count)| = 0.81).
"""

from __future__ import annotations

import functools
import itertools
import string
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax

from experiments.common import (
    add_pretrained_arg,
    load_pretrained,
    make_parser,
    new_figure,
    print_table,
    save_figure,
)
from experiments.training import (
    add_training_args,
    describe_budget,
    runs_root,
    study_config,
    train,
    train_fresh,
)
from minigpt_jax import GPTConfig
from minigpt_jax.data.tokenizers import load_tokenizer
from minigpt_jax.model.embeddings import INIT_STDDEV
from minigpt_jax.runtime.checkpoint import load_params
from minigpt_jax.runtime.run_dir import TOKENS_FILENAME
from minigpt_jax.train.step import init_state

QUERIES = ("a", "e", "A", ".", " ", "\n", "3")
# Whole-word tokens of a large BPE such as GPT-2's (absent ones are skipped).
WORD_QUERIES = (" the", " king", " Paris", " dog", " three", " running", "ing")
GROUPS = {
    "vowels": "aeiou",
    "consonants": "bcdfghjklmnpqrstvwxyz",
    "upper case": string.ascii_uppercase,
    "punctuation": string.punctuation,
    "digits": string.digits,
}


def show(label: str) -> str:
    """A printable name for a token: whitespace and control characters spelled out."""
    return {" ": "␣", "\n": "⏎", "\t": "⇥"}.get(
        label, label if label.isprintable() else repr(label)
    )


def cosine_matrix(table_VxD: np.ndarray) -> np.ndarray:
    unit_VxD = table_VxD / np.linalg.norm(table_VxD, axis=1, keepdims=True)
    return unit_VxD @ unit_VxD.T


def nearest(cos_VxV: np.ndarray, labels: list[str], query: int, k: int) -> list[tuple[str, float]]:
    """The k rows most cosine-similar to row `query`, excluding itself, most similar first."""
    order = [int(i) for i in np.argsort(-cos_VxV[query], kind="stable") if i != query][:k]
    return [(labels[i], float(cos_VxV[query, i])) for i in order]


def group_ids(labels: list[str]) -> dict[str, list[int]]:
    """Ids of single-character tokens in each group; groups with fewer than 2 are dropped."""
    groups = {
        name: [i for i, s in enumerate(labels) if s and s in chars]
        for name, chars in GROUPS.items()
    }
    return {name: ids for name, ids in groups.items() if len(ids) >= 2}


def group_stats(cos_VxV: np.ndarray, groups: dict[str, list[int]], labels: list[str]) -> dict:
    """Within- vs between-group cosine similarity, nearest-neighbour agreement, case pairs."""
    member = {i: name for name, ids in groups.items() for i in ids}
    grouped = sorted(member)
    within = {
        name: _mean_pairs(cos_VxV, itertools.combinations(ids, 2)) for name, ids in groups.items()
    }
    same = [(i, j) for i, j in itertools.combinations(grouped, 2) if member[i] == member[j]]
    cross = [(i, j) for i, j in itertools.combinations(grouped, 2) if member[i] != member[j]]
    # Nearest grouped neighbour of each grouped token, and the rate a random pick would give.
    sub = cos_VxV[np.ix_(grouped, grouped)].copy()
    np.fill_diagonal(sub, -np.inf)
    nn = [grouped[j] for j in sub.argmax(axis=1)]
    nn_rate = float(np.mean([member[i] == member[j] for i, j in zip(grouped, nn, strict=True)]))
    chance = float(np.mean([(len(groups[member[i]]) - 1) / (len(grouped) - 1) for i in grouped]))
    # Upper and lower case of the same letter, against other upper-lower pairs.
    index = {s: i for i, s in enumerate(labels)}
    letters = [c for c in string.ascii_lowercase if c in index and c.upper() in index]
    case_pairs = [(index[c.upper()], index[c]) for c in letters]
    other_pairs = [(index[a.upper()], index[b]) for a in letters for b in letters if a != b]
    return dict(
        within=within,
        within_all=_mean_pairs(cos_VxV, same),
        between=_mean_pairs(cos_VxV, cross),
        nn_same_group=nn_rate,
        nn_chance=chance,
        case_pair=_mean_pairs(cos_VxV, case_pairs),
        case_other=_mean_pairs(cos_VxV, other_pairs),
    )


def _mean_pairs(cos_VxV: np.ndarray, pairs) -> float:
    pairs = list(pairs)
    return float(np.mean([cos_VxV[i, j] for i, j in pairs])) if pairs else float("nan")


def initial_params(meta: dict) -> Any:
    """The run's params at step 0: the trainer's own init_state from the run's seed."""
    cfg = GPTConfig(**meta["gpt_config"])
    # jit: one compile instead of one per op of an eager init.
    init_fn = jax.jit(functools.partial(init_state, cfg, optax.identity()))
    return init_fn(jax.random.key(meta["config"]["seed"])).params


def pca_2d(table_VxD: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coordinates of each row on the first two principal components, their variance share)."""
    centered_VxD = table_VxD - table_VxD.mean(axis=0)
    _, singular, vt_DxD = np.linalg.svd(centered_VxD, full_matrices=False)
    share = singular**2 / np.sum(singular**2)
    return centered_VxD @ vt_DxD[:2].T, share[:2]


def run(
    outdir: Path | None = None,
    *,
    workdir: str | Path | None = None,
    steps: int = 300,
    data: str | Path | None = None,
    config: Any = None,
    queries: tuple[str, ...] = QUERIES,
    k: int = 5,
) -> dict:
    """Neighbours, PCA and group statistics of a run's token table, trained vs initial.

    workdir: a run with a checkpoint to reuse; without one, trains `config` (default
    configs/shakespeare_char.py) for `steps` steps into OUTDIR/runs/geometry (or a temp dir).
    """
    if workdir is not None and (Path(workdir) / "checkpoints").is_dir():
        print(f"reusing the run in {workdir}")
        return _analyse(Path(workdir), outdir, queries, k, trained_here=False)
    config = study_config(config, steps=steps, data=data)
    print(describe_budget(config))
    if workdir is not None:  # the user's directory: trained into, never deleted
        train(config, Path(workdir), "geometry")
        return _analyse(Path(workdir), outdir, queries, k, trained_here=True)
    with runs_root(outdir) as root:
        train_fresh(config, root / "geometry", "geometry")
        return _analyse(root / "geometry", outdir, queries, k, trained_here=True)


def _latest_step(workdir: Path) -> int:
    return max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _analyse(workdir: Path, outdir: Path | None, queries, k: int, *, trained_here: bool) -> dict:
    params, meta = load_params(workdir, "latest")
    tokenizer = load_tokenizer(workdir / "tokenizer.json")
    tokens_path = workdir / TOKENS_FILENAME
    counts = (
        np.bincount(np.load(tokens_path), minlength=tokenizer.vocab_size)
        if tokens_path.is_file()
        else None
    )
    step = _latest_step(workdir)
    result = analyse_table(
        params["embed"]["tok"]["embedding"],
        initial_params(meta)["embed"]["tok"]["embedding"],
        tokenizer,
        outdir,
        queries,
        k,
        counts=counts,
        trained_label=f"trained, step {step}",
    )
    return dict(workdir=workdir, trained_here=trained_here, step=step, **result)


def run_pretrained(
    path: str | Path,
    outdir: Path | None = None,
    *,
    queries: tuple[str, ...] = QUERIES + WORD_QUERIES,
    k: int = 5,
    max_tokens: int = 5000,
) -> dict:
    """The same analysis on a pretrained model's token table (e.g. GPT-2's 50,257 x 768), over
    its first `max_tokens` ids: for a BPE those are the 256 bytes and the earliest merges, the
    most frequent tokens. The control is a fresh N(0, 0.02^2) table of the same shape."""
    cfg, params, tokenizer = load_pretrained(path)
    init_VxD = nn.initializers.normal(INIT_STDDEV)(jax.random.key(0), (cfg.vocab_size, cfg.n_embd))
    return analyse_table(
        params["embed"]["tok"]["embedding"],
        init_VxD,
        tokenizer,
        outdir,
        queries,
        k,
        trained_label="pretrained",
        max_tokens=max_tokens,
    )


def analyse_table(
    trained_VxD,
    init_VxD,
    tokenizer,
    outdir: Path | None,
    queries,
    k: int,
    *,
    counts: np.ndarray | None = None,
    trained_label: str = "trained",
    max_tokens: int | None = None,
) -> dict:
    """Neighbours, group statistics and PCA of a token table against its control `init_VxD`.

    counts: each token's count in the corpus, for the frequency axis; max_tokens: analyse only
    the first that many rows (a V x V cosine matrix of GPT-2's vocabulary would take 20 GB).
    """
    vocab = min(tokenizer.vocab_size, max_tokens or tokenizer.vocab_size)
    labels = [tokenizer.decode([i]) for i in range(vocab)]
    tables = {
        "trained": np.asarray(trained_VxD, np.float64)[:vocab],
        "init": np.asarray(init_VxD, np.float64)[:vocab],
    }
    print(f"token table: V={len(labels)}, D={tables['trained'].shape[1]}, {trained_label}")
    # Centred: the mean row removed. A direction shared by many rows (e.g. every rare token
    # pushed down alike through the tied head) inflates raw cosines between unrelated tokens.
    variants = {
        **tables,
        **{f"{name}, centred": t - t.mean(axis=0) for name, t in tables.items()},
    }
    cosines = {name: cosine_matrix(table) for name, table in variants.items()}

    index = {s: i for i, s in enumerate(labels)}
    present = [q for q in queries if q in index]
    neighbours = {
        name: {q: nearest(cosines[name], labels, index[q], k) for q in present} for name in tables
    }
    print_table(
        f"{k} nearest tokens by cosine similarity of token-table rows",
        ["token", "trained", "init (control)"],
        [
            [show(q)]
            + [" ".join(f"{show(s)}:{c:.2f}" for s, c in neighbours[name][q]) for name in tables]
            for q in present
        ],
    )

    groups = group_ids(labels)
    stats = {name: group_stats(cos, groups, labels) for name, cos in cosines.items()}
    print_table(
        "mean cosine similarity within each group (pairs of distinct members)",
        ["group", "members", *stats],
        [
            [
                name,
                "".join(show(labels[i]) for i in ids),
                *(s["within"][name] for s in stats.values()),
            ]
            for name, ids in groups.items()
        ],
    )
    rows = (
        ("within groups (all pairs)", lambda s: s["within_all"]),
        ("between groups", lambda s: s["between"]),
        ("within - between", lambda s: s["within_all"] - s["between"]),
        ("nearest neighbour in own group", lambda s: s["nn_same_group"]),
        ("  chance", lambda s: s["nn_chance"]),
        ("cos(X, x), same letter", lambda s: s["case_pair"]),
        ("cos(X, y), other letters", lambda s: s["case_other"]),
    )
    print_table(
        "groups: cosine similarity and nearest neighbours",
        ["statistic", *stats],
        [[name, *(fn(s) for s in stats.values())] for name, fn in rows],
    )

    # Frequency: how much of the table's main axis is just how common a token is.
    log_counts = None if counts is None else np.log1p(counts[:vocab])
    pc1_frequency = {}
    for name, table in tables.items():
        coords, _ = pca_2d(table)
        pc1_frequency[name] = (
            None if log_counts is None else float(abs(np.corrcoef(coords[:, 0], log_counts)[0, 1]))
        )
    if log_counts is not None:
        print(
            "|corr(PC1, log(1 + count in the corpus))|: "
            + ", ".join(f"{name} {value:.3f}" for name, value in pc1_frequency.items())
        )

    fig, axes = new_figure(1, 2, size=(12.0, 5.5))
    colour = {name: f"C{i}" for i, name in enumerate(groups)}
    member = {i: name for name, ids in groups.items() for i in ids}
    for ax, name in zip(axes[0], ("init", "trained"), strict=True):
        coords, share = pca_2d(tables[name])
        ax.scatter(coords[:, 0], coords[:, 1], s=0)
        for i, (x, y) in enumerate(coords):
            group = member.get(i)
            ax.text(
                x,
                y,
                show(labels[i]),
                color=colour.get(group, "k"),
                fontsize=8,
                ha="center",
                va="center",
            )
        ax.set_xlabel(f"PC1 ({share[0]:.0%} of variance)")
        ax.set_ylabel(f"PC2 ({share[1]:.0%})")
        title = "initial table (control)" if name == "init" else trained_label
        ax.set_title(f"Token table, {title}")
    handles = [axes[0, 1].plot([], [], "s", color=c, label=g)[0] for g, c in colour.items()]
    axes[0, 1].legend(handles=handles, loc="best", fontsize=8)
    figure = save_figure(fig, outdir, "geometry_pca")

    return dict(
        vocab_size=len(labels),
        neighbours=neighbours["trained"],
        init_neighbours=neighbours["init"],
        groups={name: [labels[i] for i in ids] for name, ids in groups.items()},
        pc1_frequency_corr=pc1_frequency,
        stats=stats,
        figures=[figure],
    )


def main(argv=None):
    parser = add_training_args(make_parser("geometry", __doc__), steps=300)
    parser.add_argument("--workdir", type=Path, default=None, help="a trained run to reuse")
    add_pretrained_arg(parser)
    args = parser.parse_args(argv)
    if args.pretrained is not None:
        run_pretrained(args.pretrained, args.outdir)
    else:
        run(args.outdir, workdir=args.workdir, steps=args.steps, data=args.data)


if __name__ == "__main__":
    main()
