"""The lab page's HTML: tables of numbers under their captions, paragraphs, messages, and the
wrapper that marks each view with the table it was computed from."""

from __future__ import annotations

import html

import numpy as np

from minigpt_apps.lab import compute
from minigpt_apps.lab.compute import LabInputError
from minigpt_apps.lab.state import LabState, table_key, to_storage
from minigpt_apps.lab.text import TEXT, Words


def escape(text) -> str:
    return html.escape(str(text))


def boxed(table: str, caption: str, words: Words, name: str = "") -> str:
    """A table under its caption (which wraps at the screen's width), in a wrapper that scrolls
    sideways when the table is wider than the screen; the page's script marks such a wrapper
    (class lab-overflows, which then shows `scroll_hint` above the table) and makes it a Tab
    stop. The wrapper (a region) and the table are named by the caption, or by `name`."""
    cap = f'<div class="lab-caption">{escape(caption)}</div>' if caption else ""
    hint = escape(words["scroll_hint"])
    label = escape(caption or name)
    table = table.replace("<table ", f'<table aria-label="{label}" ', 1)
    return (
        f'<div class="lab-box">{cap}<div class="lab-scroll" role="region" aria-label="{label}"'
        f' data-hint="{hint}">{table}</div></div>'
    )


def matrix_html(
    matrix,
    row_labels,
    col_labels,
    *,
    words: Words = TEXT["en"],
    caption: str = "",
    rows_hl=(),
    cells_hl=(),
    spec: str = "+.3f",
    cls: str = "",
    table_id: str = "",
    name: str = "",
) -> str:
    """An HTML table of numbers in `words`' language, highlighted rows and cells, its caption
    above it (`name`: what it is called without a caption)."""
    head = "".join(f"<th>{escape(c)}</th>" for c in ["", *col_labels])
    body = []
    for i, (label, row) in enumerate(zip(row_labels, np.asarray(matrix), strict=True)):
        cells = "".join(
            f"<td{' class=hl' if (i, j) in cells_hl else ''}>{words.num(float(v), spec)}</td>"
            for j, v in enumerate(row)
        )
        row_cls = ' class="hl"' if i in rows_hl else ""
        body.append(f'<tr{row_cls}><th scope="row">{escape(label)}</th>{cells}</tr>')
    ident = f' id="{table_id}"' if table_id else ""
    table = f'<table class="lab-table {cls}"{ident}><tr>{head}</tr>{"".join(body)}</table>'
    return boxed(table, caption, words, name)


def one_hot_html(one_hot_TxV, vocab, caption: str, words: Words) -> str:
    head = f"<th></th>{''.join(f'<th>{v}</th>' for v in range(len(vocab)))}"
    body = "".join(
        f'<tr><th scope="row">t={t}</th>'
        + "".join(
            f'<td class="one">{value:g}</td>' if value else f"<td>{value:g}</td>" for value in row
        )
        + "</tr>"
        for t, row in enumerate(np.asarray(one_hot_TxV))
    )
    table = f'<table class="lab-table" id="one-hot"><tr>{head}</tr>{body}</table>'
    return boxed(table, caption, words)


def labels(state: LabState) -> list[str]:
    return [f"{i} {word}" for i, word in enumerate(state.vocab)]


def step_words() -> dict:
    return dict(input=compute.STEP_INPUT, target=compute.STEP_TARGET, rival=compute.STEP_RIVAL)


def table_html(state: LabState, words: Words, **kwargs) -> str:
    return matrix_html(
        state.table_VxD, labels(state), range(state.table_VxD.shape[1]), words=words, **kwargs
    )


def shared_table_html(state: LabState, words: Words) -> str:
    """The table on top of the page, with its fingerprint and exact values for the tests."""
    exact = html.escape(str(to_storage(state)["table"]), quote=True)
    return (
        f'<div class="lab-view" data-w="{table_key(state)}" data-table="{exact}">'
        f"{table_html(state, words, table_id='shared-table', name=words['table_heading'])}</div>"
    )


def lookup_html(
    state: LabState, ids_T, caption: str, words: Words, rows_hl=(), table_id: str = ""
) -> str:
    x_TxD = np.asarray(compute.lookup(state.table_VxD, ids_T[None]))[0]
    labels = [f"t={t}: {i} {state.vocab[i]}" for t, i in enumerate(ids_T)]
    return matrix_html(
        x_TxD,
        labels,
        range(x_TxD.shape[1]),
        words=words,
        caption=caption,
        rows_hl=rows_hl,
        table_id=table_id,
    )


def paragraph(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{escape(text)}</p>' if cls else f"<p>{escape(text)}</p>"


def view(state: LabState | None, *parts: str) -> str:
    """A view's HTML, marked with the fingerprint of the table it was computed from."""
    key = f' data-w="{table_key(state)}"' if state is not None else ""
    return f'<div class="lab-view"{key}>{"".join(parts)}</div>'


def error_html(error: LabInputError, lang: str) -> str:
    words = TEXT[lang]
    return paragraph(
        f"{words['error_prefix']}: {error.localized(lang)} ({words['kept_state']})", "lab-error"
    )


def unexpected_html(error: Exception, lang: str) -> str:
    text = TEXT[lang].f("unexpected_error", error=f"{type(error).__name__}: {error}"[:300])
    return paragraph(text, "lab-error")


def side(*tables: str) -> str:
    return f'<div class="lab-side">{"".join(tables)}</div>'


def op(symbol: str) -> str:
    return f'<span class="lab-op" aria-hidden="true">{escape(symbol)}</span>'
