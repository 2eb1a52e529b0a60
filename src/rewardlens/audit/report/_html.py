"""The page's building blocks: escaped text, numbers, tables, figures, and the plain-language line.

`Html` marks markup built here (already escaped); a plain `str` is escaped wherever it is inserted,
so text from the user or the model (pair ids, responses, concept names) can never become markup.
"""

from __future__ import annotations

import base64
import html
import math
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

from ._canvas import to_png


class Html(str):
    """Markup built here (already escaped); plain `str` is escaped wherever it is inserted."""


def e(x: object) -> Html:
    return x if isinstance(x, Html) else Html(html.escape(str(x), quote=True))


def num(x: Any, digits: int = 3) -> str:
    """A number to `digits` significant figures; '—' for None or non-finite values."""
    if x is None or (isinstance(x, (float, np.floating)) and not math.isfinite(x)):
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.{digits}g}"


def rho(mean: Any, lo: Any, hi: Any) -> str:
    """ρ with its interval, '—' when undefined."""
    if mean is None or not math.isfinite(mean):
        return "— (undefined)"
    return f"{mean:+.2f} [{num(lo, 2)}, {num(hi, 2)}]"


def interval(lo: Any, hi: Any, digits: int = 2) -> str:
    """'[lo, hi]', with '—' for undefined bounds."""
    return f"[{num(lo, digits)}, {num(hi, digits)}]"


def table(headers: Iterable[str], rows: Iterable[Iterable[object]], row_class: Iterable[str] | None = None) -> Html:
    """An HTML table; cells are escaped unless they are `Html`."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    classes = list(row_class) if row_class is not None else None
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{e(classes[i])}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
    return Html(f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def _png_size(png: bytes) -> tuple[int, int]:
    return struct.unpack(">II", png[16:24])  # the IHDR chunk: width, height


def figure(fig_id: str, fig: Any, caption: str, alt: str) -> Html:
    """A `<figure>` holding the rendered figure as a data URI (the matplotlib figure is released)."""
    png = to_png(fig)
    width, height = _png_size(png)
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return Html(f'<figure id="fig-{e(fig_id)}" data-figure="{e(fig_id)}"><img src="{uri}" alt="{e(alt)}" '
                f'width="{width}" height="{height}"><figcaption>{e(caption)}</figcaption></figure>')


def kv(items: Iterable[tuple[str, object]]) -> Html:
    return Html("<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in items) + "</dl>")


def how(text: str) -> Html:
    """The section's plain-language line: what it measures and how to read it (`text` is escaped)."""
    return Html(f'<p class="how">{e(text)}</p>')


def notrun(text: str) -> Html:
    """A note in place of a result the audit does not have (`text` is markup built here)."""
    return Html(f'<p class="notrun">{text}</p>')
