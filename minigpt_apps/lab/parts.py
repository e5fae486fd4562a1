"""The lab page as a table of parts (`PARTS`), and the widgets and events the parts are made of.

Every part is a row of `PARTS`: its widgets, a *view* (what it shows, recomputed from the shared
table and its widgets) and its *events* (an action that may change the table, then the views).
When an action changes the table, every part that reads the table is rendered again in the same
event, so no part shows an older table than the one on screen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import gradio as gr

from minigpt_apps.lab import compute
from minigpt_apps.lab.actions import (
    equal_action,
    rename_action,
    reset_action,
    show_action,
    slide_action,
    step_action,
    steps_action,
    type_value_action,
)
from minigpt_apps.lab.markup import matrix_html, step_words
from minigpt_apps.lab.text import Words
from minigpt_apps.lab.views import (
    SLIDER_RANGE,
    article_html,
    context_view,
    edit_view,
    lookup_view,
    map_view,
    positions_view,
    rename_view,
    sizes_view,
    step_view,
)


def dashed(key: str) -> str:
    """A component's elem_id: its key with dashes ("lookup_ids" -> "lookup-ids")."""
    return key.replace("_", "-")


class Field(NamedTuple):
    """A textbox labelled TEXT[lang][key]; a `decimal` field's default is written in the page's
    numbers (0,4 in Spanish)."""

    key: str
    default: str
    decimal: bool = False

    def start(self, lang: str) -> str:
        return self.default.replace(".", ",") if self.decimal and lang == "es" else self.default

    def make(self, words: Words):
        return gr.Textbox(
            self.start(words.lang), label=words[self.key], elem_id=dashed(self.key), max_lines=1
        )


class Choice(NamedTuple):
    """Radio buttons labelled TEXT[lang][key]; each option is (its text key or text, its value).
    The page's script gives a group's buttons one name: one Tab stop, arrow keys move it."""

    key: str
    options: tuple[tuple[str | None, str], ...]
    default: str

    def start(self, lang: str) -> str:
        return self.default

    def make(self, words: Words):
        options = [(words.get(text, text), value) for text, value in self.options]
        return gr.Radio(
            options, value=self.default, label=words[self.key], elem_id=dashed(self.key)
        )


class Slider(NamedTuple):
    """A slider labelled TEXT[lang][key] (its view sets its value, range and label). Its number
    box and ↺ button are off: a typed value goes through the field beside it, which reads the
    page's numbers and names the limit; the ↺ button reset to the page's start, not the table."""

    key: str
    default: float

    def start(self, lang: str) -> float:
        return self.default

    def make(self, words: Words):
        return gr.Slider(
            -SLIDER_RANGE,
            SLIDER_RANGE,
            value=self.default,
            step=0.01,
            label=words[self.key],
            elem_id=dashed(self.key),
            buttons=[],
        )


class Hidden(NamedTuple):
    """A value the page keeps beside the widgets, unseen, that the view sets and events read."""

    key: str
    default: str

    def start(self, lang: str) -> str:
        return self.default

    def make(self, words: Words):
        return gr.Textbox(self.default, visible=False, elem_id=dashed(self.key))


class Button(NamedTuple):
    """A button reading TEXT[lang][key]."""

    key: str
    primary: bool = True
    default: None = None  # a button has no value of its own

    def make(self, words: Words):
        variant = "primary" if self.primary else "secondary"
        return gr.Button(
            words[self.key],
            variant=variant,
            elem_id=dashed(self.key),
            elem_classes=["lab-button", variant],
        )


class Event(NamedTuple):
    """`trigger`'s `kind` event runs `action`, then the views (see the module's docstring).

    `keep` names outputs this event leaves alone (the slider being dragged). `stops`: the event
    first asks this tab's run to stop (Stop, Reset); with no action it does nothing else.
    `run`: the action takes `stop`, a function that says whether Stop was pressed.
    `writes_fields` False: the action sets no field, so the event's outputs leave out the other
    parts' widgets. `queued` False: the event is one request beside Gradio's queue (no status
    messages, one reply), for an action of one frame that must answer fast (the slider's keys)."""

    trigger: str
    action: Callable | None = show_action
    kind: str = "click"
    trigger_mode: str | None = None
    keep: tuple[str, ...] = ()
    stops: bool = False
    run: bool = False
    writes_fields: bool = True
    queued: bool = True


class Part(NamedTuple):
    """One part of the page: its words are TEXT[lang]["<name>_heading"] and "<name>_explain"."""

    name: str  # elem_ids part-<name>, <name>-message, <name>-result
    layout: tuple  # widgets in order: a tuple of widgets is one gr.Row, a bare widget stands alone
    view: Callable  # view(state, fields, lang) -> {output key: value}
    events: tuple[Event, ...]
    plots: tuple[str, ...] = ()  # figure keys (HTML images), in a row under the result
    reads_table: bool = True  # recomputed whenever the shared table changes
    heading_args: Callable[[], dict] | None = None  # fills the heading's {placeholders}
    above: Callable[[Words], str] | None = None  # HTML of the words, above the widgets


def _output_weights_html(words: Words) -> str:
    return matrix_html(
        compute.OUTPUT_WEIGHTS_2xD,
        [f"w_{compute.STEP_TARGET}", f"w_{compute.STEP_RIVAL}"],
        range(compute.OUTPUT_WEIGHTS_2xD.shape[1]),
        words=words,
        caption=words["step_outputs"],
    )


_LIVE = "always_last"  # a slider or a field sends its latest value once the last event is done

# The page's parts in order, as the documents go: the lookup, then their first examples (the
# article's [6, 9, 6], the lesson's tok_emb(ids)), then the ideas built on them. A new part is one
# row here, its words under its name in text.py (its heading's number is its place here).
PARTS = (
    Part(
        "lookup",
        ((Field("lookup_ids", "[0, 1, 0]"), Button("lookup_button")),),
        lookup_view,
        (Event("lookup_button"), Event("lookup_ids", kind="submit")),
    ),
    Part(
        "sizes",
        (
            (
                Field("sizes_ids", compute.format_ids(compute.LESSON_IDS)),
                Field("sizes_length", "100"),
            ),
            Button("sizes_button"),
        ),
        sizes_view,
        (
            Event("sizes_button"),
            Event("sizes_ids", kind="submit"),
            Event("sizes_length", kind="submit"),
        ),
        reads_table=False,
        above=article_html,
    ),
    Part(
        "rename",
        (
            (
                Field("rename_ids", "[0, 1, 2]"),
                Field("rename_perm", "[5, 3, 0, 1, 2, 4]"),
            ),
            Choice(
                "rename_mode",
                (("mode_both", "both"), ("mode_ids", "ids"), ("mode_rows", "rows")),
                "both",
            ),
            Button("rename_button"),
        ),
        rename_view,
        (
            Event("rename_button", rename_action),
            Event("rename_mode", kind="input", trigger_mode=_LIVE),
            Event("rename_ids", kind="submit"),
            Event("rename_perm", kind="submit"),
        ),
    ),
    Part(
        "edit",
        (
            Field("edit_ids", "[0, 1, 2, 1]"),
            Choice(
                "edit_row", tuple((f"{i} {w}", str(i)) for i, w in enumerate(compute.VOCAB)), "1"
            ),
            Choice("edit_dim", tuple((str(d), str(d)) for d in range(6)), "3"),
            Slider("edit_slider", float(compute.TABLE_VxD[1, 3])),
            Hidden("edit_shown", "1,3"),  # the cell whose value the slider holds
            (Field("edit_value", "0.9", decimal=True), Button("edit_button")),
        ),
        edit_view,
        (
            Event(
                "edit_slider",
                slide_action,
                "input",
                _LIVE,
                keep=("edit_slider",),
                writes_fields=False,
                queued=False,
            ),
            Event("edit_button", type_value_action),
            Event("edit_value", type_value_action, "submit"),
            # always_last: keys pressed while a choice is shown still reach the page (the
            # default, "once", dropped them, and the slider stayed on the old cell)
            Event("edit_row", kind="input", trigger_mode=_LIVE),
            Event("edit_dim", kind="input", trigger_mode=_LIVE),
            Event("edit_ids", kind="submit"),
        ),
    ),
    Part(
        "step",
        (
            (
                Field("step_lr", str(compute.LEARNING_RATE), decimal=True),
                Button("step_button"),
            ),
            (
                Field("step_n", "50"),
                Field("step_pace", "0", decimal=True),
                Button("steps_button"),
                Button("stop_button", primary=False),
                Button("reset_button", primary=False),
            ),
        ),
        step_view,
        (
            Event("step_button", step_action, trigger_mode="multiple", run=True),
            Event("step_lr", step_action, "submit", run=True),
            Event("steps_button", steps_action, trigger_mode="multiple", run=True),
            Event("step_n", steps_action, "submit", run=True),
            Event("step_pace", steps_action, "submit", run=True),
            Event("stop_button", None, trigger_mode="multiple", stops=True),
            Event("reset_button", reset_action, trigger_mode="multiple", stops=True),
        ),
        plots=("step_chart",),
        heading_args=step_words,
        above=_output_weights_html,
    ),
    Part("map", (), map_view, (), plots=("map_points", "map_cosine")),
    Part(
        "context",
        (
            (Field("context_a", compute.SENTENCES[0]), Field("context_b", compute.SENTENCES[1])),
            Choice(
                "context_positions",
                (("context_positions_on", "on"), ("context_positions_off", "off")),
                "on",
            ),
            (Button("context_button"), Button("equal_button", primary=False)),
        ),
        context_view,
        (
            Event("context_button"),
            Event("context_positions", kind="input", trigger_mode=_LIVE),
            Event("equal_button", equal_action),
            Event("context_a", kind="submit"),
            Event("context_b", kind="submit"),
        ),
        plots=("context_weights_a", "context_weights_b"),
    ),
    Part(
        "positions",
        (
            (
                Field("positions_dim", "16"),
                Field("positions_pos", "5"),
                Field("positions_pair", "1"),
                Field("positions_length", "64"),
            ),
            Button("positions_button"),
        ),
        positions_view,
        (
            Event("positions_button"),
            *(Event(f"positions_{key}", kind="submit") for key in ("dim", "pos", "pair", "length")),
        ),
        plots=("positions_heatmap", "positions_similarity", "positions_clock"),
        reads_table=False,
    ),
)
