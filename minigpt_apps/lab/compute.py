"""The embedding lab's numbers: pure functions over the article's 6×6 table (no UI).

Every value that the lab page shows comes from here, and so do the course experiments'
(`experiments/lookup.py`, `relabel.py`, `one_step.py`, `context.py`, `positions.py`).
Parsers turn the page's text fields into checked values and raise `LabInputError` otherwise.
"""

from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from minigpt_apps.lab.text import Cut, message
from minigpt_jax.model.attention import attention_weights, causal_mask, mix_values
from minigpt_jax.model.config import GPTConfig
from minigpt_jax.model.embeddings import Embeddings
from minigpt_jax.model.positions import sinusoidal_positions

# ----------------------------------------------------------------------------- the article's table

# Six Polish words with readable 6-d vectors. The `kamienny` row is chosen so that one training
# step lands on the article's numbers (see `sgd_step`).
VOCAB = ("oto", "kamienny", "zamek", "metalowy", "klucz", "drzwi")
TABLE_VxD = np.array(
    [
        [0.1, 0.0, -0.3, 0.2, 0.4, -0.1],  # oto ("here is")
        [-0.2, 0.1, 0.3, 0.5, -0.4, 0.2],  # kamienny ("stone", adj.)
        [0.6, -0.2, 0.1, -0.3, 0.0, 0.4],  # zamek ("castle" or "lock")
        [0.3, 0.5, -0.2, 0.1, 0.2, -0.4],  # metalowy ("metal", adj.)
        [0.4, -0.1, 0.2, -0.5, 0.3, 0.1],  # klucz ("key")
        [-0.3, 0.2, 0.0, 0.1, -0.2, 0.5],  # drzwi ("door")
    ],
    dtype=np.float32,
)

# The training step: input "kamienny", the next word should be "zamek", not "klucz".
LEARNING_RATE = 0.4
STEP_INPUT, STEP_TARGET, STEP_RIVAL = "kamienny", "zamek", "klucz"
# Frozen output vectors (rows: zamek, klucz); they differ by Δw = (1.3, -0.7, 0.7, 0, 0, 0), so
# g = -0.12 before the step gives p = 0.470 and ‖Δw‖² = 2.67 gives p = 0.610 after it.
OUTPUT_WEIGHTS_2xD = np.array(
    [
        [0.8, -0.3, 0.5, 0.1, 0.0, -0.2],  # w_zamek
        [-0.5, 0.4, -0.2, 0.1, 0.0, -0.2],  # w_klucz
    ],
    dtype=np.float32,
)
SENTENCES = ("oto kamienny zamek", "oto metalowy zamek")


class LabInputError(ValueError):
    """Bad input from the page: `key` and `params` name a message of `lab.text` in any language."""

    def __init__(self, key: str, **params):
        self.key, self.params = key, params
        super().__init__(message("en", key, **params))

    def localized(self, lang: str) -> str:
        return message(lang, self.key, **self.params)


# ----------------------------------------------------------------------------- parsing the fields

_INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only (\d would take ٣ and ３)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).smallest_subnormal)  # ≈ 1.4e-45

# Limits that keep every part of the page responsive (each named in its message).
MAX_CHARS = 1_000  # characters in one text field
MAX_IDS = 64  # ids in one lookup
MAX_WORDS = 32  # words in one sentence of the context part (its weights are words × words)
MAX_POSITIONS = 512  # positions shown, and the largest width D, of the positions part
MAX_STEPS = 500  # training steps in one run
MAX_LEARNING_RATE = 10.0  # |learning rate|
MAX_VALUE = 100.0  # |a coordinate| typed into the table


def _digits(item: str) -> int:
    """Significant digits of an integer's text: leading zeros do not count (0000 is 0)."""
    return len(item.lstrip("+-").lstrip("0"))


def _short(text: str, limit: int = 24) -> str:
    """A field's text as a message quotes it: at most `limit` characters (text.Cut says how
    long the whole was, in the page's language)."""
    text = str(text).strip()
    return text if len(text) <= limit else Cut(text[:limit], len(text))


def _check_length(text: str, field: str) -> str:
    text = str(text)
    if len(text) > MAX_CHARS:
        raise LabInputError("too_long", field=field, limit=MAX_CHARS, got=len(text))
    return text


# Typographic characters read as what they stand for (the documents are typeset): the
# ellipsis as three dots, the minus sign (U+2212) as a hyphen-minus.
_TYPOGRAPHY = str.maketrans({"\N{HORIZONTAL ELLIPSIS}": "...", "\N{MINUS SIGN}": "-"})
_ELLIPSIS = re.compile(r"(?:,\s*)?\.\.\.\s*(?=\]?\s*$)")  # "..." closing the list


def typeset(text: str) -> str:
    """The text with the documents' typographic characters in their plain forms."""
    return str(text).translate(_TYPOGRAPHY)


class ReadIds(NamedTuple):
    """Ids as read, and how the text differed from a plain list: a closing "..." (the lesson's
    "and so on") left out, the outer brackets of a batch of one taken off."""

    ids_T: np.ndarray
    ellipsis: bool = False
    batch: bool = False


def read_ids(text: str, vocab_size: int, **options) -> ReadIds:
    """`parse_ids` (with its `options`), which also reads the lesson's ways of writing ids:
    `[76, 299, 412, ...]` (the closing "..." or "…" left out) and `[[76, 299, 412]]` (a batch
    of one: its one row)."""
    body = typeset(_check_length(text, options.get("field", "ids"))).strip()
    batch = bool(re.fullmatch(r"\[\s*\[[^\[\]]*\]\s*\]", body))
    if batch:
        body = body[1:-1].strip()
    ellipsis = bool(_ELLIPSIS.search(body)) and bool(re.search(r"[0-9]", body))
    if ellipsis:
        body = _ELLIPSIS.sub("", body)
    return ReadIds(parse_ids(body, vocab_size, **options), ellipsis, batch)


def parse_ids(
    text: str,
    vocab_size: int,
    *,
    field: str = "ids",
    limit: int = MAX_IDS,
    example: str = "[0, 1, 0]",
) -> np.ndarray:
    """'[0, 1, 0]' (brackets optional; commas or spaces) -> ids (T,) int32 in [0, vocab_size),
    at most `limit` of them; `example` is the list a message suggests."""
    body = _check_length(text, field).strip()
    if body.startswith("[") or body.endswith("]"):
        if (
            not (body.startswith("[") and body.endswith("]"))
            or "[" in body[1:-1]
            or "]" in body[1:-1]
        ):
            raise LabInputError("malformed_list", field=field, text=_short(text), example=example)
        body = body[1:-1]
    items = [item for item in re.split(r"[,\s]+", body.strip()) if item]
    if not items:
        raise LabInputError("empty_list", field=field, example=example)
    if re.search(r",\s*,|^\s*,|,\s*$", body):
        raise LabInputError("malformed_list", field=field, text=_short(text), example=example)
    if len(items) > limit:
        raise LabInputError("too_many_ids", field=field, limit=limit, got=len(items))
    for item in items:
        if not _INTEGER.fullmatch(item):
            raise LabInputError(
                "not_an_id", field=field, item=_short(item), high=vocab_size - 1, example=example
            )
    for item in items:  # compared as Python ints: an id beyond 64 bits is out of range, too
        if _digits(item) > 12 or not 0 <= int(item) < vocab_size:
            raise LabInputError(
                "id_out_of_range", field=field, id=_short(item), high=vocab_size - 1
            )
    return np.array([int(item) for item in items], dtype=np.int32)


def parse_permutation(text: str, size: int) -> np.ndarray:
    """A permutation of 0..size-1 written as a list: perm_V[i] is the new id of id i."""
    example = format_ids(np.roll(np.arange(size), 1))  # a permutation, unlike [0, 1, 0]
    perm_V = parse_ids(text, size, field="permutation", limit=size + 1, example=example)
    if len(perm_V) != size:
        raise LabInputError("permutation_length", size=size, got=len(perm_V), high=size - 1)
    counts = np.bincount(perm_V, minlength=size)
    if (counts != 1).any():
        raise LabInputError(
            "permutation_repeat", id=int(np.argmax(counts > 1)), missing=int(np.argmin(counts))
        )
    return perm_V


def parse_number(
    text,
    *,
    field: str,
    low: float = -_FLOAT32_MAX,
    high: float = _FLOAT32_MAX,
    decimal_comma: bool = False,
) -> float:
    """A number in [low, high] from a text field, rounded to the float32 the table holds.

    Checked after the rounding, so a value that is finite in float64 but not in float32 (1e39) is
    refused, and so is one that rounds to 0 (1e-46: float32's smallest is ≈ 1.4e-45).
    `decimal_comma` also reads 0,4 as 0.4 (the Spanish page)."""
    raw = _check_length(text, field).strip()
    plain = typeset(raw)  # "−0.4", typeset with the minus sign, is -0.4
    spelled = plain.replace(",", ".") if decimal_comma and plain.count(",") == 1 else plain
    try:
        if not spelled.isascii() or "_" in spelled:  # float() takes 1_000, ３ and ٣ as well
            raise ValueError(spelled)
        value = float(spelled)
    except ValueError:
        key = "not_a_number_comma" if "," in raw and not decimal_comma else "not_a_number"
        raise LabInputError(key, field=field, text=_short(raw)) from None
    with np.errstate(over="ignore"):
        rounded = float(np.float32(value))
    if not math.isfinite(value) or not math.isfinite(rounded):
        raise LabInputError("not_finite", field=field, text=_short(raw))
    if value != 0 and rounded == 0:  # 1e-46: below float32's smallest subnormal
        raise LabInputError("rounds_to_zero", field=field, text=_short(raw), smallest=_FLOAT32_TINY)
    if not low <= value <= high:
        raise LabInputError(
            "number_out_of_bounds", field=field, text=_short(raw), low=low, high=high
        )
    return rounded


def parse_int(text, *, field: str, low: int, high: int) -> int:
    """An integer in [low, high] from a text field (or a number widget's value)."""
    raw = _check_length(text, field).strip()
    if raw.endswith(".0"):  # number widgets send 3.0 for 3
        raw = raw[:-2]
    if not _INTEGER.fullmatch(raw):
        raise LabInputError("not_an_integer", field=field, text=_short(raw), low=low, high=high)
    if _digits(raw) > 12 or not low <= int(raw) <= high:
        raise LabInputError("out_of_bounds", field=field, value=_short(raw), low=low, high=high)
    return int(raw)


# Around a word, what a sentence quoted from the article or typed as prose may hold.
_PUNCTUATION = "«»“”„\"'‘’.,;:!?¡¿()…"


def read_sentence(text: str, vocab: tuple[str, ...]) -> str:
    """The words of `text` as the vocabulary holds them, one space apart: a word not in it is
    read without the quotes and punctuation around it, and in lower case, when that form is
    (the article writes «Oto kamienny zamek»); any other word is left for parse_sentence to
    refuse."""
    read = []
    for word in _check_length(text, "sentence").split():
        plain = word.strip(_PUNCTUATION)
        read.append(
            word if word in vocab else next((w for w in (plain, plain.lower()) if w in vocab), word)
        )
    return " ".join(w for w in read if w.strip(_PUNCTUATION) or w in vocab)


def parse_sentence(text: str, vocab: tuple[str, ...], *, limit: int = MAX_WORDS) -> np.ndarray:
    """Words of `vocab` separated by spaces (read as `read_sentence` reads them) -> ids (T,)
    int32, at most `limit` words."""
    words = read_sentence(text, vocab).split()
    if not words:
        raise LabInputError("empty_sentence", vocab=", ".join(vocab))
    if len(words) > limit:
        raise LabInputError("too_many_words", limit=limit, got=len(words))
    for word in words:
        if word not in vocab:
            raise LabInputError("unknown_word", word=_short(word), vocab=", ".join(vocab))
    return np.array([vocab.index(word) for word in words], dtype=np.int32)


def check_finite(table_VxD) -> None:
    """Refuse a table with nan or ±inf (no part could show it)."""
    if not np.isfinite(np.asarray(table_VxD)).all():
        raise LabInputError("table_not_finite")


def format_ids(ids) -> str:
    """[5, 3, 0]: one space after each comma."""
    return "[" + ", ".join(str(int(i)) for i in np.asarray(ids).ravel()) + "]"


# ----------------------------------------------------------------------------- 1-3: lookup, rename


def lookup(table_VxD, tokens_BxT):
    """x_BxTxD = W_E[ids] through the model's own Embeddings module (positions off)."""
    vocab, dim = table_VxD.shape
    cfg = GPTConfig(vocab_size=vocab, n_embd=dim, n_head=1, pos_encoding="none", dropout=0.0)
    return Embeddings(cfg).apply({"params": {"tok": {"embedding": table_VxD}}}, tokens_BxT)


def one_hot_lookup(table_VxD, tokens_BxT):
    """x_BxTxD = one_hot(ids) · W_E, at full float32 precision (no TF32 on GPUs)."""
    one_hot_BxTxV = jax.nn.one_hot(tokens_BxT, table_VxD.shape[0], dtype=table_VxD.dtype)
    return jnp.einsum("btv,vd->btd", one_hot_BxTxV, table_VxD, precision=jax.lax.Precision.HIGHEST)


def one_hot(ids_T, vocab_size: int) -> np.ndarray:
    """The (T, V) one-hot matrix of the ids: row t has a single 1, in column ids_T[t]."""
    return np.asarray(jax.nn.one_hot(jnp.asarray(ids_T), vocab_size, dtype=jnp.float32))


def rename_rows(table_VxD: np.ndarray, perm_V: np.ndarray) -> np.ndarray:
    """The table with row i moved to row perm_V[i] (id i renamed perm_V[i])."""
    renamed_VxD = np.empty_like(table_VxD)
    renamed_VxD[perm_V] = table_VxD
    return renamed_VxD


def rename_vocab(vocab: tuple[str, ...], perm_V: np.ndarray) -> tuple[str, ...]:
    """The words in their new id order: word i gets id perm_V[i]."""
    renamed = [""] * len(vocab)
    for i, word in enumerate(vocab):
        renamed[perm_V[i]] = word
    return tuple(renamed)


class Renaming(NamedTuple):
    """Lookups of the same ids before and after renaming ids, rows, or both by one permutation."""

    ids_T: np.ndarray
    renamed_ids_T: np.ndarray  # what the lookup reads after the renaming
    renamed_table_VxD: np.ndarray
    before_TxD: np.ndarray
    after_TxD: np.ndarray
    max_abs_diff: float


def rename(table_VxD, ids_T, perm_V, *, ids: bool = True, rows: bool = True) -> Renaming:
    """Rename the ids, the rows or both by perm_V and look the same tokens up again."""
    new_ids_T = perm_V[ids_T] if ids else np.asarray(ids_T)
    new_table_VxD = rename_rows(np.asarray(table_VxD), perm_V) if rows else np.asarray(table_VxD)
    before_TxD = np.asarray(lookup(table_VxD, np.asarray(ids_T)[None]))[0]
    after_TxD = np.asarray(lookup(new_table_VxD, new_ids_T[None]))[0]
    return Renaming(
        ids_T=np.asarray(ids_T),
        renamed_ids_T=new_ids_T,
        renamed_table_VxD=new_table_VxD,
        before_TxD=before_TxD,
        after_TxD=after_TxD,
        max_abs_diff=float(np.abs(after_TxD - before_TxD).max()),
    )


def set_coordinate(table_VxD: np.ndarray, row: int, dim: int, value: float) -> np.ndarray:
    """A copy of the table with W_E[row, dim] = value."""
    edited_VxD = np.array(table_VxD, dtype=np.float32, copy=True)
    edited_VxD[row, dim] = value
    return edited_VxD


def changed_positions(before_TxD, after_TxD) -> list[int]:
    """Positions t whose vector differs at all."""
    return [int(t) for t in np.flatnonzero(np.abs(np.asarray(after_TxD - before_TxD)).max(-1) > 0)]


# ----------------------------------------------------------------------------- 4: one training step


def two_logits(table_VxD, output_2xD, input_id: int):
    """[logit_target, logit_rival] of the input word's row."""
    return output_2xD @ table_VxD[input_id]


def step_loss(table_VxD, output_2xD, input_id: int):
    """Cross-entropy of the right next word (class 0 of the two)."""
    return -jax.nn.log_softmax(two_logits(table_VxD, output_2xD, input_id))[0]


class Step(NamedTuple):
    """One plain SGD step on the whole table; p is p(target), gap is logit_target - logit_rival."""

    table_VxD: np.ndarray  # after the step
    grad_VxD: np.ndarray
    p_before: float
    p_after: float
    loss_before: float
    loss_after: float
    gap_before: float
    gap_after: float
    changed_rows: list[int]


def sgd_step(table_VxD, output_2xD, input_id: int, learning_rate: float) -> Step:
    """table - lr · jax.grad(step_loss): only the input row has a non-zero gradient (a gather's
    gradient is a scatter into the rows that were read)."""
    table = jnp.asarray(table_VxD, jnp.float32)
    output = jnp.asarray(output_2xD, jnp.float32)
    grad_VxD = jax.grad(step_loss)(table, output, input_id)
    new_table = table - learning_rate * grad_VxD

    def stats(t):
        logits_2 = two_logits(t, output, input_id)
        p = float(jax.nn.softmax(logits_2)[0])
        return p, float(step_loss(t, output, input_id)), float(logits_2[0] - logits_2[1])

    (p0, loss0, gap0), (p1, loss1, gap1) = stats(table), stats(new_table)
    new_table_VxD = np.asarray(new_table)
    changed = [
        i
        for i in range(new_table_VxD.shape[0])
        if not np.array_equal(new_table_VxD[i], np.asarray(table_VxD)[i])
    ]
    return Step(new_table_VxD, np.asarray(grad_VxD), p0, p1, loss0, loss1, gap0, gap1, changed)


class Stats(NamedTuple):
    """p(target), the loss and the logit gap target - rival at one table; the two logits
    (target, rival) and p(rival), the softmax's other half, that produce them."""

    p: float
    loss: float
    gap: float
    logit_target: float = math.nan
    logit_rival: float = math.nan
    p_rival: float = math.nan


def step_stats(table_VxD, output_2xD, input_id: int) -> Stats:
    logits_2 = two_logits(jnp.asarray(table_VxD), jnp.asarray(output_2xD), input_id)
    loss = -jax.nn.log_softmax(logits_2)[0]
    loss_64 = np.float64(loss)  # p as train_steps computes it, so the chart sees the same figure
    target, rival = (float(v) for v in logits_2)
    p_rival = float(jax.nn.softmax(logits_2)[1])
    return Stats(float(np.exp(-loss_64)), float(loss_64), target - rival, target, rival, p_rival)


def step_gradient(table_VxD, output_2xD, input_id: int) -> np.ndarray:
    """dloss/dW_E at the table: non-zero only in the input row."""
    table = jnp.asarray(table_VxD, jnp.float32)
    return np.asarray(jax.grad(step_loss)(table, jnp.asarray(output_2xD), input_id))


@functools.partial(jax.jit, static_argnames="input_id")
def _jitted_step(table_VxD, output_2xD, input_id: int, learning_rate):
    loss, grad_VxD = jax.value_and_grad(step_loss)(table_VxD, output_2xD, input_id)
    return table_VxD - learning_rate * grad_VxD, loss


class Run(NamedTuple):
    """n SGD steps: the table after them, p(target) and the loss before each step and after the
    last (n + 1 values each)."""

    table_VxD: np.ndarray
    p_Q1: np.ndarray
    loss_Q1: np.ndarray


def train_steps(table_VxD, output_2xD, input_id: int, learning_rate: float, n: int) -> Run:
    """`n` steps of `sgd_step`'s update (one jitted step, reused). Raises LabInputError, leaving the
    caller's table alone, if a step would leave float32's range."""
    table = jnp.asarray(table_VxD, jnp.float32)
    output = jnp.asarray(output_2xD, jnp.float32)
    lr = jnp.float32(learning_rate)
    losses = []
    for _ in range(n):
        table, loss = _jitted_step(table, output, input_id, lr)
        losses.append(loss)
    final = jnp.asarray(step_loss(table, output, input_id))
    loss_Q1 = np.asarray(jnp.stack([*losses, final]), np.float64)
    new_table_VxD = np.asarray(table)
    check_finite(new_table_VxD)
    if not np.isfinite(loss_Q1).all():
        raise LabInputError("table_not_finite")
    return Run(new_table_VxD, np.exp(-loss_Q1), loss_Q1)


# ----------------------------------------------------------------------------- the token map


def _article_axes():
    """The two principal directions of the article's table (rows centred), each with its largest
    loading positive: fixed axes, so the map's points move when the table changes."""
    table = jnp.asarray(TABLE_VxD)
    centre_D = table.mean(0)
    _, _, vt_DxD = jnp.linalg.svd(table - centre_D[None], full_matrices=False)
    axes_2xD = vt_DxD[:2]
    signs_2 = jnp.sign(axes_2xD[jnp.arange(2), jnp.abs(axes_2xD).argmax(1)])
    return centre_D, axes_2xD * signs_2[:, None]


class TokenMap(NamedTuple):
    """Each row projected on the article table's two principal axes, and every pair's cosine."""

    points_Vx2: np.ndarray
    cosine_VxV: np.ndarray


def token_map(table_VxD) -> TokenMap:
    table = jnp.asarray(table_VxD, jnp.float32)
    centre_D, axes_2xD = _article_axes()
    points_Vx2 = jnp.einsum(
        "vd,kd->vk", table - centre_D[None], axes_2xD, precision=jax.lax.Precision.HIGHEST
    )
    norms_V = jnp.linalg.norm(table, axis=1)
    unit_VxD = table / jnp.maximum(norms_V, 1e-30)[:, None]  # a zero row has cosine 0
    cosine_VxV = jnp.einsum("vd,wd->vw", unit_VxD, unit_VxD, precision=jax.lax.Precision.HIGHEST)
    return TokenMap(np.asarray(points_Vx2), np.asarray(jnp.clip(cosine_VxV, -1.0, 1.0)))


# ----------------------------------------------------------------------------- 5: context


class Head(NamedTuple):
    """One causal attention head with Q = K = V = x = embedding + sinusoidal position."""

    inputs_TxD: np.ndarray
    weights_TxT: np.ndarray  # row: query, column: key
    outputs_TxD: np.ndarray


def one_head(table_VxD, ids_T, *, positions: bool = True, causal: bool = True) -> Head:
    """The identity-QKV head of the context demo, through the model's attention functions:
    causal, on embedding + sinusoidal position (`positions` False: the embedding alone;
    `causal` False: every word sees every word)."""
    tokens_1xT = jnp.asarray(ids_T)[None]
    length = tokens_1xT.shape[1]
    x_1xTxD = lookup(jnp.asarray(table_VxD), tokens_1xT)
    if positions:
        x_1xTxD = x_1xTxD + sinusoidal_positions(length, table_VxD.shape[1])[None]
    positions_1xT = jnp.arange(length)[None, :]
    x_1xTx1xD = x_1xTxD[:, :, None, :]  # one head of width D; the identity projections
    mask = causal_mask(positions_1xT, positions_1xT) if causal else None
    weights_1x1xTxT = attention_weights(x_1xTx1xD, x_1xTx1xD, mask)
    out_1xTx1xD = mix_values(weights_1x1xTxT, x_1xTx1xD)
    return Head(
        np.asarray(x_1xTxD[0]), np.asarray(weights_1x1xTxT[0, 0]), np.asarray(out_1xTx1xD[0, :, 0])
    )


# ----------------------------------------------------------------------------- 6: positions


def position_similarity(length: int, dim: int) -> np.ndarray:
    """P[i]·P[j] for the sinusoidal table of `length` positions: (length, length)."""
    table_TxD = np.asarray(sinusoidal_positions(length, dim))
    return table_TxD @ table_TxD.T


class PositionPair(NamedTuple):
    """PE(pos, 2i) = sin(pos·ω_i) and PE(pos, 2i+1) = cos(pos·ω_i)."""

    sin: float
    cos: float
    omega: float
    period: float  # positions per full turn, 2π/ω_i


def clock_hands(pos: int, dim: int) -> np.ndarray:
    """(sin, cos) of every pair at position pos, from the model's sinusoidal table: (dim/2, 2).
    Each pair is a clock hand at angle pos·ω_i; low pairs turn fast, high pairs slowly."""
    return np.asarray(sinusoidal_positions(pos + 1, dim))[pos].reshape(dim // 2, 2)


def position_pair(pos: int, pair: int, dim: int) -> PositionPair:
    """The two coordinates of pair i at position pos, from the model's sinusoidal table."""
    sin, cos = clock_hands(pos, dim)[pair]
    omega = float(1.0 / 10000.0 ** (2 * pair / dim))
    return PositionPair(float(sin), float(cos), omega, 2 * math.pi / omega)


# ----------------------------------------------------------------------------- 8: sizes

# The article's lookup [6, 9, 6] reads a fragment of a larger table of three coordinates: it shows
# rows 6 and 9 (coordinates separated by semicolons) and reads "the first, the second and again
# the first of the rows shown". The article's own coordinates are not in this repository: these
# are the lab's, in the article's form.
ARTICLE_IDS = (6, 9, 6)
FRAGMENT_IDS = (6, 9)  # the rows the fragment shows, in order
FRAGMENT_RxD = np.array([[0.2, -0.4, 0.1], [0.0, -0.2, 0.3]], np.float32)  # rows 6 and 9


def fragment_lookup(ids_T=ARTICLE_IDS) -> np.ndarray:
    """x_TxD = the fragment's rows for `ids_T` (ids among FRAGMENT_IDS): [6, 9, 6] reads the
    first, the second and again the first of the rows shown, through the model's Embeddings."""
    shown_T = np.array([FRAGMENT_IDS.index(int(i)) for i in ids_T], np.int32)
    return np.asarray(lookup(FRAGMENT_RxD, shown_T[None]))[0]


# The lesson's example: `V, d = 512, 128` and `x = tok_emb(ids)` -> (1, 3, 128), no positions;
# its later h(0) adds learned positions W_P (here up to block_size 64). GPT-2's sizes
# (V = 50,257, d = 768) go only with the tying count.
LESSON_VOCAB, LESSON_DIM, LESSON_BLOCK = 512, 128, 64
LESSON_IDS = (76, 299, 412)
GPT2_VOCAB, GPT2_DIM = 50_257, 768


def lesson_config(**overrides) -> GPTConfig:
    fields = dict(vocab_size=LESSON_VOCAB, n_embd=LESSON_DIM, n_head=1, block_size=LESSON_BLOCK)
    return GPTConfig(**{**fields, "pos_encoding": "learned", "dropout": 0.0, **overrides})


@functools.lru_cache(maxsize=1)
def lesson_params():
    """Embeddings(lesson_config()) initialised with key 0: W_E (512, 128) and W_P (64, 128),
    made once and shared by every request."""
    params = Embeddings(lesson_config()).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
    return nn.unbox(params)


def lesson_lookup(ids_T) -> np.ndarray:
    """The lesson's x = tok_emb(ids): x_1xTxD = W_E[ids], no positions (the model's Embeddings
    with positions off, on the lesson's W_E)."""
    table_VxD = lesson_params()["params"]["tok"]["embedding"]
    return np.asarray(lookup(table_VxD, jnp.asarray(ids_T, jnp.int32)[None]))


def lesson_h0(ids_T) -> np.ndarray:
    """The lesson's later h(0) = W_E[ids] + W_P[0 .. T-1]: x_1xTxD through the model's
    Embeddings with learned positions. Raises the model's ValueError when T exceeds
    block_size (W_P has no row for position 64)."""
    tokens_1xT = jnp.asarray(ids_T, jnp.int32)[None]
    return np.asarray(Embeddings(lesson_config()).apply(lesson_params(), tokens_1xT))


def lesson_readout(h_1xTxD) -> np.ndarray:
    """The tied read-out of the lesson's model: logits_1xTxV = h · W_Eᵀ, through the model's
    own `Embeddings.attend` on the lesson's W_E (no second matrix)."""
    h_1xTxD = jnp.asarray(h_1xTxD, jnp.float32)
    logits = Embeddings(lesson_config()).apply(lesson_params(), h_1xTxD, method="attend")
    return np.asarray(logits)[..., :LESSON_VOCAB]


def lesson_distances(ids_T) -> np.ndarray:
    """‖W_E[i] − W_E[j]‖ for every pair of the ids, on the lesson's W_E: (T, T)."""
    rows_TxD = np.asarray(lesson_params()["params"]["tok"]["embedding"], np.float64)[list(ids_T)]
    return np.linalg.norm(rows_TxD[:, None] - rows_TxD[None], axis=-1)


def embedding_table_size(vocab_size: int, dim: int) -> int:
    """Parameters of the model's token table W_E for (V, D), from its shapes alone."""
    cfg = GPTConfig(vocab_size=vocab_size, n_embd=dim, n_head=1, pos_encoding="none")
    shapes = jax.eval_shape(
        lambda key: Embeddings(cfg).init(key, jnp.zeros((1, 1), jnp.int32)), jax.random.key(0)
    )
    table = shapes["params"]["tok"]["embedding"]
    return int(getattr(table, "value", table).size)  # unwrapped from its sharding annotation
