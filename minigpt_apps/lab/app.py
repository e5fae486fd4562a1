"""The lab page: Gradio blocks over `lab.compute`, one shared table per browser tab.

The page is built from `parts.PARTS`, whose docstring says what a part is. Each browser tab's
table lives on the server (`Tab.state`), and a tab's events apply one after the other, in the
order it sent them (`Tab.turn`), while other tabs' events run beside them (no Gradio concurrency
limit). A copy goes to the browser's storage (`gr.BrowserState`), from which a reload restores it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import json
import logging
import socket
import threading
import time
import webbrowser
from collections.abc import Callable, Iterator
from typing import NamedTuple

import gradio as gr
from starlette.middleware import Middleware

from minigpt_apps.lab import compute
from minigpt_apps.lab.actions import (
    FRAME,
    RESYNC,
    Pause,
    equal_action,
    restore_action,
    show_action,
)
from minigpt_apps.lab.compute import LabInputError
from minigpt_apps.lab.markup import error_html, shared_table_html, unexpected_html, view
from minigpt_apps.lab.parts import PARTS, Event, Part, dashed
from minigpt_apps.lab.serving import Gatekeeper, lab_origins, remove_temp_dir
from minigpt_apps.lab.state import STORAGE_KEY, LabState, initial_state, to_storage
from minigpt_apps.lab.text import LANGUAGES, TEXT, Words

log = logging.getLogger(__name__)

# System fonts only: the page loads nothing from outside 127.0.0.1.
_THEME = gr.themes.Default(
    font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
)
_CSS = """
.lab-box { max-width: 100%; min-width: 0; }
.lab-caption { font-weight: 600; font-size: 13px; padding: 4px 0; overflow-wrap: anywhere; }
.lab-scroll { overflow-x: auto; max-width: 100%; -webkit-overflow-scrolling: touch; }
.lab-scroll.lab-overflows { border-right: 4px solid #6b7280; }
.lab-scroll.lab-overflows::before { content: attr(data-hint); display: block; position: sticky;
  left: 0; font-size: 12px; color: #374151; white-space: normal; }
.lab-table { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 13px;
  white-space: nowrap; }
.lab-table td, .lab-table th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
.lab-table th { background: #f3f3f3; }
.lab-table th[scope=row] { text-align: left; }
.lab-table tr.hl td, .lab-table td.hl { background: #ffe08a; }
.lab-table td.one { background: #cfe3ff; font-weight: 700; }
.lab-figures th[scope=row] { white-space: normal; min-width: 5em; max-width: 12em; }
.lab-side { display: flex; gap: 10px; flex-wrap: wrap; align-items: center; }
@media (min-width: 601px) {  /* the lookup's one_hot · W_E = x is one line at 1400 px */
  .lab-side .lab-table td, .lab-side .lab-table th { padding: 2px 4px; }
}
.lab-side > * { min-width: 0; max-width: 100%; }
.lab-op { font-size: 22px; font-weight: 700; }
.lab-ok { color: #0a6b2d; font-weight: 600; }
.lab-diff { color: #a13d00; font-weight: 600; }
.lab-error { color: #b00020; font-weight: 600; border-left: 4px solid #b00020; padding-left: 8px; }
.lab-big { font-size: 18px; font-weight: 700; }
.lab-explain { font-size: 14px; color: #333; }
.lab-figure { max-width: 100%; height: auto; display: block; }
.lab-plots { flex-wrap: wrap !important; }
.lab-plots > * { flex: 1 1 300px !important; min-width: min(300px, 100%) !important; }
button.lab-button { border: 2px solid #4b5563 !important; border-radius: 8px !important;
  box-shadow: 0 1px 2px rgba(0,0,0,.25) !important; font-weight: 600 !important; }
button.lab-button.secondary { background: #ffffff !important; color: #1f2937 !important; }
button.lab-button:hover { filter: brightness(0.95); }
#edit-slider input[type=number] { display: none; }
/* Gradio's status tracker writes "processing | 0.3s" and "queue: 1/2" in English inside every
   output of an event (and so inside the live message regions); the lab's messages say what an
   event is doing in the page's words, so the tracker is neither shown nor read out. */
[data-testid="status-tracker"] { display: none !important; }
:focus-visible { outline: 3px solid #1d4ed8 !important; outline-offset: 2px; }
@media (max-width: 600px) {
  /* every table fits 390 px unscrolled (15 of 20 scrolled sideways): Gradio's 12 px HTML
     padding (and its 32 px margins, in _HEAD_CSS) give way to the tables, whose type and
     padding shrink a little */
  .html-container { padding-left: 2px !important; padding-right: 2px !important; }
  .lab-table { font-size: 10px; }
  .lab-table td, .lab-table th { padding: 1px 2px; }
  .lab-table th[scope=row] { white-space: normal; max-width: 6em; overflow-wrap: break-word; }
  .lab-big { font-size: 15px; }
  .lab-figures.lab-big { font-size: 13px; }  /* the step figures fit 390 px unscrolled */
  /* a long label ("softmax(logits)_zamek") breaks inside its cell rather than spilling out
     (the other tables scroll sideways, and keep their labels whole) */
  .lab-figures th[scope=row] { min-width: 0; max-width: 6.5em; overflow-wrap: anywhere; }
}
"""


def _widgets(layout: tuple):
    """The layout's widgets in order."""
    for item in layout:
        yield from item if type(item) is tuple else (item,)


def _defaults(lang: str = "en") -> dict:
    """Every widget's starting value by key, in the page's numbers."""
    return {
        w.key: w.start(lang)
        for part in PARTS
        for w in _widgets(part.layout)
        if w.default is not None
    }


def _render(part: Part, state: LabState, fields: dict, lang: str, *, own: bool) -> dict:
    """The part's view. Bad input in another part's fields is that part's message, not an error
    of this event; the part's own bad input raises (nothing changes, its message says why)."""
    try:
        return part.view(state, fields, lang)
    except LabInputError as error:
        if own:
            raise
        cleared = {key: "" for key in part.plots}
        return {f"{part.name}_result": view(state, error_html(error, lang)), **cleared}


_PART_NAMES = tuple(part.name for part in PARTS)


class Tab:
    """One browser tab's table on the server, its events' turns, the flag that stops its run,
    and what its outputs show now (sent again only when they change).

    Each event takes a ticket as it arrives (in the server's event loop, so in the order the
    tab sent them) and runs when its turn comes: a tab's events apply one after the other, in
    order, while other tabs' events run beside them. (An event outside Gradio's queue, the
    slider's, arrives with its request; a queued one when the queue starts it, a few ms later.)"""

    def __init__(self):
        self.state = initial_state()
        self.stop = threading.Event()
        self.shown: dict[str, str] = {}
        self.used: dict[str, dict] = {}  # see Page.outputs
        self._tickets = itertools.count()
        self._serving = 0
        self._finished: set[int] = set()
        self._waiting: dict[int, asyncio.Future] = {}
        self.running = asyncio.Lock()  # held by a run from before its turn to its end

    def ticket(self) -> int:
        return next(self._tickets)

    async def turn(self, ticket: int) -> None:
        if self._serving != ticket:
            future = asyncio.get_running_loop().create_future()
            self._waiting[ticket] = future
            await future

    def release(self, ticket: int) -> None:
        """The event is done (or abandoned): the next ticket's turn."""
        self._finished.add(ticket)
        while self._serving in self._finished:
            self._finished.discard(self._serving)
            self._serving += 1
        future = self._waiting.pop(self._serving, None)
        if future is not None and not future.done():
            future.set_result(None)


async def _sleep_until(due: float, stopped: Callable[[], bool]) -> None:
    while (left := due - time.monotonic()) > 0 and not stopped():
        await asyncio.sleep(min(0.05, left))


class Tabs:
    """The open tabs by Gradio's session hash; a closed tab is dropped (`demo.unload`), and
    beyond `limit` the longest unused one goes, so memory stays flat."""

    def __init__(self, limit: int = 64):
        self.limit = limit
        self._tabs: collections.OrderedDict[str, Tab] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, session: str) -> Tab:
        with self._lock:
            tab = self._tabs.pop(session, None) or Tab()
            self._tabs[session] = tab
            while len(self._tabs) > self.limit:
                self._tabs.popitem(last=False)
            return tab

    def drop(self, session: str) -> None:
        with self._lock:
            self._tabs.pop(session, None)

    def __len__(self) -> int:
        return len(self._tabs)


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "local"


def drop_skipped_copies(blocks: gr.Blocks | None, session: str) -> None:
    """Drops, from the session's copy of the page, the components Gradio added to it during
    events.

    For each output an event leaves unchanged (`Page.changed` does not send it) and for each
    `gr.update`, Gradio (6.31) builds a new instance of the component, and during a queued event
    that instance also lands in the session's blocks under a fresh id, where nothing reads it
    and nothing removes it: about 9 a lab event, each holding its HTML (the server grew about
    80 kB an event, without end). The page's own ids stay: those are the session's components."""
    state = getattr(blocks, "state_holder", None)
    state = state.session_data.get(session) if state is not None else None
    if state is None:
        return
    session_blocks = state.blocks_config.blocks
    for key in [key for key in session_blocks if key not in blocks.blocks]:
        del session_blocks[key]
        state.config_values.pop(key, None)


class Page(NamedTuple):
    """The built page's components by key, the language, the open tabs and the page's Blocks
    (None outside a served page)."""

    components: dict
    lang: str
    tabs: Tabs
    blocks: gr.Blocks | None = None

    def fields(self, values: dict) -> dict:
        """The event's input values by key (Gradio passes a set of inputs as a dict)."""
        return {key: values[c] for key, c in self.components.items() if c in values}

    def handler(self, part: Part, event: Event) -> Callable:
        """The Gradio function of one event: action, then views, then outputs by component.
        The tab's turn lasts the whole event, so the tab's events apply one after the other;
        other tabs do not wait (the work runs in threads). A run gives its turn up between its
        frames (`Pause`), so the tab's other events answer during it; one that changes the
        table stops the run first (the run says where it stopped, and its last chunk, computed
        from the table before the change, is not applied)."""

        allowed = set(self.output_components(part, event))
        changes_table = event.action not in (None, show_action, equal_action) and not event.run

        async def handle(values: dict, request: gr.Request = None):
            session = _session(request)
            tab = self.tabs.get(session)
            drop_skipped_copies(self.blocks, session)  # those of the tab's last event
            if event.stops or changes_table:  # a run in progress ends after its frame
                tab.stop.set()
            if event.action is None:  # Stop: it writes nothing (the run says where it stopped)
                yield None
                return
            fields = self.fields(values)
            # A run waits for the run in progress (its turn comes after that run's end, not in
            # one of its pauses); any other event takes its turn in the order it came.
            running = tab.running if event.run else contextlib.nullcontext()
            await running.__aenter__()
            ticket = tab.ticket()
            changed_under = False  # the table was changed by another event during a run's pause
            try:
                await tab.turn(ticket)
                if event.run:
                    tab.stop.clear()
                state = tab.state
                if event.run:
                    action = functools.partial(
                        event.action, state, fields, self.lang, tab.stop.is_set
                    )
                else:
                    action = functools.partial(event.action, state, fields, self.lang)
                results = await asyncio.to_thread(action)
                results = results if isinstance(results, Iterator) else iter([results])
                while (result := await asyncio.to_thread(next, results, None)) is not None:
                    if isinstance(result, Pause):  # the tab's other events go meanwhile
                        tab.release(ticket)
                        ticket = None
                        await _sleep_until(result.due, tab.stop.is_set)
                        ticket = tab.ticket()
                        await tab.turn(ticket)
                        if tab.state is not state:  # an event that changed it stopped the run
                            state, changed_under = tab.state, True
                            tab.stop.set()
                        continue
                    new_state, note, extra = result
                    if changed_under:  # the run's table is older than the tab's: not applied
                        new_state = None
                    out = await asyncio.to_thread(
                        self.outputs, part, event, state, new_state, note, fields, extra, tab.used
                    )
                    if new_state is not None:
                        tab.state = state = new_state
                    yield self.changed(tab, {c: v for c, v in out.items() if c in allowed})
            except LabInputError as error:
                yield {self.components[f"{part.name}_message"]: error_html(error, self.lang)}
            except Exception as error:  # noqa: BLE001 - no error reaches the page unexplained
                log.exception("lab: %s's %s failed", part.name, event.trigger)
                message = self.components[f"{part.name}_message"]
                yield {message: unexpected_html(error, self.lang)}
            finally:
                if ticket is not None:
                    tab.release(ticket)
                await running.__aexit__(None, None, None)
                drop_skipped_copies(self.blocks, session)

        if event.queued:
            return handle
        assert not event.run, f"{event.trigger}: a run streams its frames through the queue"

        async def answer(values: dict, request: gr.Request = None):
            """The event's one frame as one reply (an event outside Gradio's queue)."""
            out = {}
            async for out in handle(values, request):  # noqa: B007 - the last frame is the reply
                pass
            return out

        return answer

    def changed(self, tab: Tab, out: dict) -> dict:
        """The outputs whose HTML differs from what the tab shows (the rest are not sent); the
        messages always go (errors are written beside this record, and Gradio takes an empty
        dict for a missing value)."""
        messages = {self.components[f"{name}_message"] for name in ("table", *_PART_NAMES)}
        sent = {}
        for component, value in out.items():
            key = component._id
            if isinstance(value, str) and component not in messages:
                if tab.shown.get(key) == value:
                    continue
                tab.shown[key] = value
            sent[component] = value
        return sent

    def outputs(self, part, event, state, new_state, note, fields, extra, used=None) -> dict:
        """The outputs of one step of an event by component: the new state and every view that
        reads it (or this part's view alone; a run's frame: the table and this part), the
        widgets the action set, the part's message.

        `used` holds, per part, the fields it last showed without an error: another part is
        recomputed from those, so a half-typed field there is not read until it is submitted."""
        used = {} if used is None else used
        extra = dict(extra)
        frame = extra.pop(FRAME, False)
        keep = () if extra.pop(RESYNC, False) else event.keep
        fields, out = {**fields, **extra}, {}
        if new_state is not None:
            compute.check_finite(new_state.table_VxD)
            out.update(storage=to_storage(new_state))
            out["table"] = shared_table_html(new_state, TEXT[self.lang])
            for other in PARTS:
                if other.reads_table and other is not part and not frame:
                    keys = {w.key for w in _widgets(other.layout)}
                    shown = {
                        **used.get(other.name, {}),
                        **{k: extra[k] for k in keys & extra.keys()},
                    }
                    used[other.name] = shown  # the fields the action set (a rename's ids) shown
                    out.update(_render(other, new_state, {**fields, **shown}, self.lang, own=False))
        out.update(_render(part, new_state or state, fields, self.lang, own=True))
        used[part.name] = {w.key: fields[w.key] for w in _widgets(part.layout) if w.key in fields}
        for key, value in extra.items():  # a value set beside a view's update (choices) joins it
            shown = out.get(key)
            out[key] = gr.update(**{**shown, "value": value}) if isinstance(shown, dict) else value
        out = {key: value for key, value in out.items() if key not in keep}
        if new_state is not None:  # no other part's message outlives the table it spoke of
            out.update({f"{name}_message": "" for name in ("table", *_PART_NAMES)})
        if note is not None:  # None: the message shown stays (a slider event that changed nothing)
            out[f"{part.name}_message"] = note
        return {self.components[key]: value for key, value in out.items() if key in self.components}

    def output_components(self, part: Part, event: Event | None = None) -> list:
        """Everything an event of `part` may write: for one that may change the table, the
        table, every view and widget and every part's message (a change of the table clears the
        others', which spoke of the table before); for one that only shows (it never
        changes the table), its own part's outputs and widgets alone, so that the other parts
        stay usable while it runs."""
        if event is not None and event.action is None:
            return []
        if event is not None and event.action in (show_action, equal_action):
            own = {f"{part.name}_result", f"{part.name}_message", *part.plots}
            own.update(w.key for w in _widgets(part.layout) if w.default is not None)
            return [c for key, c in self.components.items() if key in own]
        if event is not None and not event.writes_fields:  # the other parts' widgets stay
            others = {w.key for other in PARTS if other is not part for w in _widgets(other.layout)}
            return [c for key, c in self.components.items() if key not in others]
        return list(self.components.values())


def _heading(part: Part, words: Words) -> str:
    heading = words[f"{part.name}_heading"]
    if part.heading_args:
        heading = words.f(f"{part.name}_heading", **part.heading_args())
    return f"## {heading}"


def _build_widgets(layout: tuple, words: Words) -> dict:
    """The layout's widgets by key, each tuple of them in a gr.Row."""
    widgets = {}
    for item in layout:
        if type(item) is tuple:
            with gr.Row(equal_height=True):
                widgets.update((widget.key, widget.make(words)) for widget in item)
        else:
            widgets[item.key] = item.make(words)
    return widgets


def _build_part(part: Part, components: dict, start: LabState, lang: str) -> None:
    """The part's group: heading, explanation, widgets, message, result and plots."""
    words = TEXT[lang]
    fields = {**_defaults(lang), "state": start}
    shown = part.view(start, fields, lang)
    with gr.Group(elem_id=f"part-{part.name}"):
        gr.Markdown(_heading(part, words))
        gr.Markdown(words[f"{part.name}_explain"], elem_classes=["lab-explain"])
        if part.above:
            gr.HTML(part.above(words))
        components.update(_build_widgets(part.layout, words))
        components[f"{part.name}_message"] = gr.HTML("", elem_id=f"{part.name}-message")
        result_key = f"{part.name}_result"
        components[result_key] = gr.HTML(shown[result_key], elem_id=dashed(result_key))
        if part.plots:
            with gr.Row(elem_classes=["lab-plots"]):
                for key in part.plots:
                    components[key] = gr.HTML(
                        shown[key], elem_id=dashed(key), min_width=300, js_on_load=None
                    )


# The page's script (in <head>, before Gradio's own): Gradio's words in the page's language
# (it reads navigator.language), <html lang>, the aria-labels Gradio writes in English, one name
# per radio group and its label as its name, live messages, a mark and a Tab stop on each table
# wrapper that scrolls sideways (only those), and the slider's value as aria-valuetext.
_PAGE_JS = """<script>
(() => {
  const LANG = "__LANG__";
  const ARIA = __ARIA__;
  for (const key of ["language", "languages"]) {
    try {
      Object.defineProperty(Navigator.prototype, key, {
        configurable: true, get: () => (key === "language" ? LANG : [LANG]),
      });
    } catch (error) {}
  }
  const fixGroups = () => {  // Gradio renames a radio it re-renders: one group again, at once
    document.querySelectorAll("fieldset").forEach((group, k) => {
      const name = "lab-group-" + (group.id || k);
      group.querySelectorAll("input[type=radio]").forEach((radio) => {
        if (radio.name !== name) radio.name = name;
      });
      const info = group.querySelector("[data-testid=block-info]");
      if (info) {
        if (!info.id) info.id = name + "-label";
        if (group.getAttribute("aria-labelledby") !== info.id) {
          group.setAttribute("aria-labelledby", info.id);
          group.setAttribute("role", "radiogroup");
        }
      }
    });
  };
  const fix = () => {
    const root = document.documentElement;
    if (root.lang !== LANG) root.lang = LANG;
    fixGroups();
    document.querySelectorAll("[aria-label]").forEach((element) => {
      const label = element.getAttribute("aria-label");
      for (const [english, local] of ARIA) {
        if (label.startsWith(english)) {
          element.setAttribute("aria-label", local + label.slice(english.length));
          break;
        }
      }
    });
    document.querySelectorAll("[id$='-message']").forEach((element) => {
      if (!element.hasAttribute("aria-live")) element.setAttribute("aria-live", "polite");
    });
    document.querySelectorAll(".lab-scroll").forEach((wrap) => {
      const overflows = wrap.scrollWidth > wrap.clientWidth + 1;
      wrap.classList.toggle("lab-overflows", overflows);
      if (overflows && wrap.getAttribute("tabindex") !== "0") wrap.setAttribute("tabindex", "0");
      if (!overflows && wrap.hasAttribute("tabindex")) wrap.removeAttribute("tabindex");
    });
    sayValue();
  };
  const sayValue = () => {  // the slider's value as the page prints it: "+0.810", "+0,810"
    const range = document.querySelector("#edit-slider input[type=range]");
    if (!range) return;
    const value = Number(range.value);
    let text = (value < 0 ? "-" : "+") + Math.abs(value).toFixed(3);
    if (LANG === "es") text = text.replace(".", ",");
    if (range.getAttribute("aria-valuetext") !== text) range.setAttribute("aria-valuetext", text);
  };
  document.addEventListener("input", sayValue, true);
  setInterval(sayValue, 250);  // values the server sets change no attribute the observer sees
  let queued = false;
  const later = () => {
    if (queued) return;
    queued = true;
    setTimeout(() => { queued = false; fix(); }, 30);
  };
  // A key on a radio button moves within its group only while the group's buttons share a
  // name: the names are mended before the key's default action and after every change.
  document.addEventListener("keydown", (e) => e.target.type === "radio" && fixGroups(), true);
  new MutationObserver(() => { fixGroups(); later(); }).observe(document.documentElement, {
    subtree: true, childList: true, characterData: true, attributes: true,
    attributeFilter: ["lang", "name", "aria-label"],
  });
  window.addEventListener("resize", later);
})();
</script>"""


# Gradio prefixes the page's css (_CSS) with its container, so a rule for the container's own
# margins goes to the head as written.
_HEAD_CSS = """<style>
@media (max-width: 600px) {
  .gradio-container .main.app { padding-left: 6px !important; padding-right: 6px !important; }
}
</style>
"""


def page_js(lang: str) -> str:
    aria = TEXT[lang]["aria"] if lang != "en" else []
    return _PAGE_JS.replace("__LANG__", lang).replace("__ARIA__", json.dumps(aria))


def build(lang: str = "en") -> gr.Blocks:
    """The lab's Blocks in `lang` (one of LANGUAGES): the shared table, then every part in PARTS."""
    if lang not in LANGUAGES:
        raise ValueError(f"--lang must be one of {', '.join(LANGUAGES)}, got {lang!r}.")
    words = TEXT[lang]
    start = initial_state()
    with gr.Blocks(title=words["title"], analytics_enabled=False) as demo:
        components = {
            "storage": gr.BrowserState(to_storage(start), storage_key=STORAGE_KEY),
        }
        gr.Markdown(f"# {words['title']}\n\n{words['intro']}")
        with gr.Group(elem_id="part-table"):
            gr.Markdown(f"**{words['table_heading']}**")
            components["table"] = gr.HTML(shared_table_html(start, words), elem_id="table")
            components["table_message"] = gr.HTML("", elem_id="table-message")
        for part in PARTS:
            _build_part(part, components, start, lang)
        page = Page(components, lang, Tabs(), demo)
        demo.lab_tabs = page.tabs  # the tests and the memory script count the open tabs
        widgets = {w.key for part in PARTS for w in _widgets(part.layout) if w.default is not None}
        inputs = {components[key] for key in ("storage", *widgets)}
        restore = Part("table", (), lambda s, f, lang: {}, (), reads_table=False)
        demo.load(
            page.handler(restore, Event("load", restore_action)),
            inputs,
            page.output_components(restore),
            concurrency_limit=None,
            show_progress="hidden",
        )

        def closed(request: gr.Request):
            page.tabs.drop(_session(request))

        demo.unload(closed)
        for part in PARTS:
            for event in part.events:
                getattr(components[event.trigger], event.kind)(
                    page.handler(part, event),
                    inputs,
                    page.output_components(part, event),
                    trigger_mode=event.trigger_mode,
                    queue=event.queued,
                    concurrency_limit=None,  # each tab's lock orders its own events
                    # Gradio's tracker prints "processing | 0.3s" in English on every page;
                    # a run says where it is in the page's words (steps_running).
                    show_progress="hidden",
                )
    return demo


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(lang: str = "en", port: int | None = None) -> tuple[gr.Blocks, str]:
    """The lab served on 127.0.0.1 from a background thread: (its Blocks, its URL)."""
    demo = build(lang)
    port = port or free_port()
    demo.queue(default_concurrency_limit=None)
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        quiet=True,
        prevent_thread_lock=True,
        theme=_THEME,
        css=_CSS,
        head=_HEAD_CSS + page_js(lang),
        footer_links=[],
        # Gradio's run history wrote every event's inputs and outputs (every part's HTML, up to
        # 100 events) to the browser's localStorage, on each event: a slider key spent about
        # 70 ms of the page's time there, and the history grew as the learner worked.
        run_history=False,
        # No file reaches the lab (it has no file input), and no other site's page drives it.
        app_kwargs={"middleware": [Middleware(Gatekeeper, origins=lab_origins(port))]},
        max_file_size="1kb",  # Gradio's own bound, should a file route ever pass the gate
    )
    return demo, f"http://127.0.0.1:{port}/"


def launch(*, port: int | None = None, open_browser: bool = False, lang: str = "en") -> None:
    """Serve the lab on 127.0.0.1 until interrupted; prints the URL first."""
    demo, url = serve(lang, port)
    print(f"minigpt-jax lab: {url} (Ctrl-C stops it)", flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        demo.block_thread()
    finally:
        demo.close()
        remove_temp_dir()
