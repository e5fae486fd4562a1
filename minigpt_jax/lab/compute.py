"""The embedding lab's numbers: pure functions over the article's 6×6 table (no UI).

Every value that the lab page shows comes from here, and so do the course experiments'
(`experiments/lookup.py`, `relabel.py`, `one_step.py`, `context.py`, `positions.py`).
Parsers turn the page's text fields into checked values and raise `LabInputError` otherwise.
"""

from __future__ import annotations

import json
import math
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from minigpt_jax.lab.text import message
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

_INTEGER = re.compile(r"[+-]?\d+")


def parse_ids(text: str, vocab_size: int, *, field: str = "ids") -> np.ndarray:
    """'[0, 1, 0]' (brackets optional; commas or spaces) -> ids (T,) int32 in [0, vocab_size)."""
    body = text.strip()
    if body.startswith("[") or body.endswith("]"):
        if (
            not (body.startswith("[") and body.endswith("]"))
            or "[" in body[1:-1]
            or "]" in body[1:-1]
        ):
            raise LabInputError("malformed_list", field=field, text=text.strip())
        body = body[1:-1]
    items = [item for item in re.split(r"[,\s]+", body.strip()) if item]
    if not items:
        raise LabInputError("empty_list", field=field)
    if re.search(r",\s*,|^\s*,|,\s*$", body):
        raise LabInputError("malformed_list", field=field, text=text.strip())
    for item in items:
        if not _INTEGER.fullmatch(item):
            raise LabInputError("not_an_id", field=field, item=item, high=vocab_size - 1)
    ids = np.array([int(item) for item in items], dtype=np.int64)
    for i in ids:
        if not 0 <= i < vocab_size:
            raise LabInputError("id_out_of_range", field=field, id=int(i), high=vocab_size - 1)
    return ids.astype(np.int32)


def parse_permutation(text: str, size: int) -> np.ndarray:
    """A permutation of 0..size-1 written as a list: perm_V[i] is the new id of id i."""
    perm_V = parse_ids(text, size, field="permutation")
    if len(perm_V) != size:
        raise LabInputError("permutation_length", size=size, got=len(perm_V), high=size - 1)
    counts = np.bincount(perm_V, minlength=size)
    if (counts != 1).any():
        raise LabInputError(
            "permutation_repeat", id=int(np.argmax(counts > 1)), missing=int(np.argmin(counts))
        )
    return perm_V


def parse_number(text: str, *, field: str) -> float:
    """A finite float from a text field."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise LabInputError("not_a_number", field=field, text=str(text).strip()) from None
    if not math.isfinite(value):
        raise LabInputError("not_finite", field=field, text=str(text).strip())
    return value


def parse_int(text: str, *, field: str, low: int, high: int) -> int:
    """An integer in [low, high] from a text field (or a number widget's value)."""
    raw = str(text).strip()
    if raw.endswith(".0"):  # number widgets send 3.0 for 3
        raw = raw[:-2]
    if not _INTEGER.fullmatch(raw):
        raise LabInputError("not_an_integer", field=field, text=raw, low=low, high=high)
    value = int(raw)
    if not low <= value <= high:
        raise LabInputError("out_of_bounds", field=field, value=value, low=low, high=high)
    return value


def parse_sentence(text: str, vocab: tuple[str, ...]) -> np.ndarray:
    """Words of `vocab` separated by spaces -> ids (T,) int32."""
    words = text.split()
    if not words:
        raise LabInputError("empty_sentence", vocab=", ".join(vocab))
    for word in words:
        if word not in vocab:
            raise LabInputError("unknown_word", word=word, vocab=", ".join(vocab))
    return np.array([vocab.index(word) for word in words], dtype=np.int32)


def format_ids(ids) -> str:
    return json.dumps([int(i) for i in np.asarray(ids).ravel()]).replace(",", ", ")


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


# ----------------------------------------------------------------------------- 5: context


class Head(NamedTuple):
    """One causal attention head with Q = K = V = x = embedding + sinusoidal position."""

    inputs_TxD: np.ndarray
    weights_TxT: np.ndarray  # row: query, column: key
    outputs_TxD: np.ndarray


def one_head(table_VxD, ids_T) -> Head:
    """The identity-QKV causal head of the context demo, through the model's attention functions."""
    tokens_1xT = jnp.asarray(ids_T)[None]
    length = tokens_1xT.shape[1]
    x_1xTxD = (
        lookup(jnp.asarray(table_VxD), tokens_1xT)
        + sinusoidal_positions(length, table_VxD.shape[1])[None]
    )
    positions_1xT = jnp.arange(length)[None, :]
    x_1xTx1xD = x_1xTxD[:, :, None, :]  # one head of width D; the identity projections
    weights_1x1xTxT = attention_weights(
        x_1xTx1xD, x_1xTx1xD, causal_mask(positions_1xT, positions_1xT)
    )
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
