"""What the lab page's buttons and fields do: each action makes the shared table's next state."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from minigpt_apps.lab import compute
from minigpt_apps.lab.markup import paragraph
from minigpt_apps.lab.state import LabState, from_storage, initial_state, table_key
from minigpt_apps.lab.text import TEXT
from minigpt_apps.lab.views import edit_cell, number, rename_inputs, stats

MIN_PACE = 1.0  # the slowest pace (above 0): a run of MAX_STEPS ends within 500 s
RUN_FRAMES = 20  # chunks of one run of N steps: where it may stop, and the most frames it shows
FRAME_SECONDS = 0.25  # the least time between two frames of a run (the page renders each one)
MAX_PACE = 1000.0  # steps a second a learner may ask for (0: as fast as the machine goes)

# action(state, fields, lang) -> (new state or None if unchanged, note HTML, {widget key: value})
# or an iterator of such triples (a run of steps, shown as it goes). A FRAME key in the widget
# values marks a frame of a run that re-renders only the table and the run's own part.

FRAME = "_frame"


class Pause(NamedTuple):
    """Yielded by a run between its frames: the run goes on at `due` (time.monotonic()), and
    the tab's other events may run meanwhile (one that changes the table stops the run)."""

    due: float


# In the widget values: the slider is set anew (by an event that otherwise leaves the slider
# being dragged alone).
RESYNC = "_resync"


def show_action(state, fields, lang):
    """Recompute this part's view only."""
    return None, "", {}


def rename_action(state: LabState, fields: dict, lang: str):
    """Renaming ids and rows together is applied to the shared table; then π's inverse and the
    renamed ids fill the fields, so pressing Rename again undoes it; the lookup's and the edit's ids
    (and the edited row) are renamed too, so they read the same words as before."""
    words = TEXT[lang]
    ids_T, perm_V, mode = rename_inputs(state, fields)
    if mode != "both":
        return None, paragraph(words["rename_not_applied"]), {}
    result = compute.rename(state.table_VxD, ids_T, perm_V)
    new_state = LabState(result.renamed_table_VxD, compute.rename_vocab(state.vocab, perm_V))
    new_state = new_state._replace(steps=state.steps, history=state.history)
    inverse_V = np.argsort(perm_V)
    note = words.f(
        "rename_applied",
        diff=result.max_abs_diff,
        word=compute.STEP_INPUT,
        id=new_state.vocab.index(compute.STEP_INPUT),
    )
    extra = {
        "rename_ids": compute.format_ids(result.renamed_ids_T),
        "rename_perm": compute.format_ids(inverse_V),
        **_renamed_fields(fields, perm_V),
    }
    note += _mapped_note(extra, "rename_fields_mapped", lang)
    return new_state, paragraph(note, "lab-ok"), extra


def _mapped_note(renamed: dict, key: str, lang: str) -> str:
    """The sentence that says what the lookup's and the edit's ids became (empty if a field was
    left)."""
    if not {"lookup_ids", "edit_ids", "edit_row"} <= renamed.keys():
        return ""
    lookup, edit, row = renamed["lookup_ids"], renamed["edit_ids"], renamed["edit_row"]
    return " " + TEXT[lang].f(key, lookup=lookup, edit=edit, row=row)


def _renamed_fields(fields: dict, perm_V: np.ndarray) -> dict:
    """The lookup's and the edit's ids (and the edited row) renamed by π, so that after a rename
    they read the same words as before; a field that does not hold valid ids is left as it is."""
    renamed = {}
    for key in ("lookup_ids", "edit_ids"):
        try:
            ids_T = compute.read_ids(fields[key], len(perm_V)).ids_T
            renamed[key] = compute.format_ids(perm_V[ids_T])
        except (compute.LabInputError, KeyError):
            pass
    try:
        row = compute.parse_int(fields["edit_row"], field="row", low=0, high=len(perm_V) - 1)
        renamed["edit_row"] = str(int(perm_V[row]))
    except (compute.LabInputError, KeyError):
        pass
    return renamed


def _set_value(state: LabState, fields: dict, lang: str, value: float, quiet_same=False):
    """Sets the edited cell to `value`; when it already holds it, says so, or (`quiet_same`, the
    slider's repeated last event) returns no note, so the note of the change stays shown."""
    words = TEXT[lang]
    ids_T = compute.read_ids(fields["edit_ids"], len(state.vocab)).ids_T
    row, dim = edit_cell(state, fields)
    old = float(state.table_VxD[row, dim])
    positions = ", ".join(map(str, np.flatnonzero(ids_T == row))) or "—"
    if old == value and quiet_same:
        return None, None, {}
    if old == value:
        note = words.f("edit_same", row=row, dim=dim, value=value, positions=positions)
        return None, paragraph(note, "lab-ok"), {}
    edited_VxD = compute.set_coordinate(state.table_VxD, row, dim, value)
    new_state = state._replace(table_VxD=edited_VxD, last_run=None)
    before_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    after_TxD = np.asarray(compute.lookup(edited_VxD, ids_T[None]))[0]
    changed = compute.changed_positions(before_TxD, after_TxD)
    others = [t for t in range(len(ids_T)) if ids_T[t] != row]
    other = float(np.abs(after_TxD[others] - before_TxD[others]).max()) if others else 0.0
    summary = words.f("edit_summary", row=row, dim=dim, word=state.vocab[row], old=old, new=value)
    if changed:
        effect = words.f(
            "edit_changed", positions=", ".join(map(str, changed)), row=row, other=other
        )
    else:
        effect = words.f("edit_nothing", row=row)
    return new_state, paragraph(f"{summary} {effect}", "lab-ok"), {}


def slide_action(state: LabState, fields: dict, lang: str):
    """The slider's value into the chosen cell; when the slider still showed another cell (a
    key pressed on it before the page had moved it to a new choice: `edit_shown`, set with the
    slider, says which), nothing is written and the slider moves to the chosen cell."""
    limit = compute.MAX_VALUE
    value = compute.parse_number(fields["edit_slider"], field="value", low=-limit, high=limit)
    row, dim = edit_cell(state, fields)
    if fields.get("edit_shown", f"{row},{dim}") != f"{row},{dim}":
        note = TEXT[lang].f(
            "edit_slider_moved", row=row, dim=dim, value=float(state.table_VxD[row, dim])
        )
        return None, paragraph(note), {RESYNC: True}
    return _set_value(state, fields, lang, value, quiet_same=True)


def type_value_action(state: LabState, fields: dict, lang: str):
    limit = compute.MAX_VALUE
    value = number(fields, "edit_value", lang, low=-limit, high=limit)
    return _set_value(state, fields, lang, value)


def _learning_rate(fields: dict, lang: str) -> float:
    limit = compute.MAX_LEARNING_RATE
    return number(fields, "step_lr", lang, low=-limit, high=limit)


def _run(
    state: LabState, n: int, learning_rate: float, lang: str, stop=None, pace: float = 0.0
) -> Iterator:
    """n steps in up to RUN_FRAMES chunks, or at a `pace` of steps a second in chunks of at
    least FRAME_SECONDS' steps, each lasting its steps' time; a chunk's state is yielded when
    FRAME_SECONDS have passed since the last frame (and after the last chunk). `stop()` true
    ends the run after the chunk in progress (a paced run's also while it waits)."""
    words = TEXT[lang]
    input_id = state.vocab.index(compute.STEP_INPUT)
    before = stats(state)
    grad_VxD = compute.step_gradient(state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id)
    last_run = dict(
        n=n,
        p=before.p,
        loss=before.loss,
        gap=before.gap,
        rows=[],
        lr=learning_rate,
        grad=grad_VxD.tolist(),
        before=state.table_VxD.tolist(),
    )
    start_VxD, history, done = state.table_VxD, list(state.history), 0
    chunk = max(1, math.ceil(pace * FRAME_SECONDS) if pace else math.ceil(n / RUN_FRAMES))
    shown_at = -math.inf
    while done < n:
        size, started_at = min(chunk, n - done), time.monotonic()
        run = compute.train_steps(
            state.table_VxD, compute.OUTPUT_WEIGHTS_2xD, input_id, learning_rate, size
        )
        if not history or history[-1][0] != state.steps:
            history.append((state.steps, float(run.p_Q1[0]), float(run.loss_Q1[0])))
        history += [
            (state.steps + k + 1, float(p), float(loss))
            for k, (p, loss) in enumerate(zip(run.p_Q1[1:], run.loss_Q1[1:], strict=True))
        ]
        done += size
        rows = [
            i for i in range(len(start_VxD)) if not np.array_equal(run.table_VxD[i], start_VxD[i])
        ]
        state = LabState(
            run.table_VxD,
            state.vocab,
            state.steps + size,
            tuple(history[-10 * compute.MAX_STEPS :]),
            {**last_run, "n": done, "rows": rows},
        )
        due = started_at + size / pace if pace else 0.0  # the chunk's steps at the pace
        stopped = stop is not None and stop() and done < n
        last = done == n or stopped
        if not last and not pace and time.monotonic() - shown_at < FRAME_SECONDS:
            continue  # a frame the page would still be drawing when the next came: skipped
        shown_at = time.monotonic()
        if stopped:
            note = words.f("steps_stopped", done=done, n=n)
        else:
            key = "steps_running" if not last else "step_done" if n == 1 else "steps_done"
            note = words.f(key, done=done, n=n)
        if learning_rate == 0:
            note += " " + words["step_lr_zero"]
        yield state, paragraph(note, "lab-ok"), {} if last else {FRAME: True}
        if last:
            return
        yield Pause(due)  # a paced chunk lasts its steps' time; the tab's events go meanwhile
        if stop is not None and stop():
            note = words.f("steps_stopped", done=done, n=n)
            yield state, paragraph(note, "lab-ok"), {}
            return


def step_action(state: LabState, fields: dict, lang: str, stop=None):
    return _run(state, 1, _learning_rate(fields, lang), lang, stop)


def steps_action(state: LabState, fields: dict, lang: str, stop=None):
    n = compute.parse_int(fields["step_n"], field="steps", low=1, high=compute.MAX_STEPS)
    learning_rate = _learning_rate(fields, lang)
    pace = number(fields, "step_pace", lang, low=0.0, high=MAX_PACE)
    if 0 < pace < MIN_PACE:  # 1e-7 a second: a run that would never end on its own
        raise compute.LabInputError(
            "pace_too_slow", text=fields["step_pace"].strip(), low=MIN_PACE, high=MAX_PACE
        )
    return _run(state, n, learning_rate, lang, stop, pace)


def reset_action(state: LabState, fields: dict, lang: str):
    """The article's table; after renames, the lookup's and the edit's ids go back with the
    table's, so they read the same words as before."""
    back_V = np.array([compute.VOCAB.index(word) for word in state.vocab])
    if np.array_equal(back_V, np.arange(len(back_V))):
        return initial_state(), paragraph(TEXT[lang]["reset_done"], "lab-ok"), {}
    extra = _renamed_fields(fields, back_V)
    note = TEXT[lang]["reset_done"] + _mapped_note(extra, "reset_fields_mapped", lang)
    return initial_state(), paragraph(note, "lab-ok"), extra


def equal_action(state: LabState, fields: dict, lang: str):
    return None, "", {"context_b": fields["context_a"]}


def restore_action(state: LabState, fields: dict, lang: str):
    """On page load: the table kept in this browser's storage, or the article's."""
    words = TEXT[lang]
    stored = from_storage(fields["storage"])
    if stored is None:
        return initial_state(), paragraph(words["storage_fresh"]), {}
    if table_key(stored) == table_key(initial_state()) and stored.steps == 0:
        return stored, paragraph(words["storage_fresh"]), {}
    return stored, paragraph(words.f("storage_restored", n=stored.steps), "lab-ok"), {}
