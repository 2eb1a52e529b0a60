"""The one owner of the HTML a notebook shows for a result (`_repr_html_`), escaped by construction.

Every piece is built by `tag`, which escapes every text child and every attribute value; a `Html` is markup
built here and is the only thing inserted unescaped. So text from the user or the model (a pair's
response, a token, a concept name) can never become markup, `<script>` included. The view holds no script,
fetches nothing (the figure is inline SVG) and styles itself with one `<style>` scoped to `.rl-view`.

`result_html(result)` is what every result's `_repr_html_` returns (through `HtmlView`): the result's
name and what it is (its docstring's first line), its headline numbers with their intervals (`summary()`:
a frame indexed by headline name with `value` and optional `low`, `high`, `n`; older list, dict or text
summaries are shown as they are), its top rows ranked by the statistic the result ranks by, and its own
`plot()` as SVG. A base-layer module: it imports no other rewardlens module, matplotlib only to draw.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

TOP_ROWS = 10
"""How many rows the view's table shows (the result's `to_frame()` holds them all)."""
MAX_TEXT = 120
"""A longer cell is cut here (with '…'); its whole text is on hover."""


class Html(str):
    """Markup built by `tag` (already escaped); a plain `str` is escaped wherever it is inserted."""


def e(x: object) -> Html:
    """`x` as escaped text (a `Html` is kept as it is)."""
    return x if isinstance(x, Html) else Html(html.escape(str(x), quote=True))


def tag(name: str, *children: object, **attrs: object) -> Html:
    """`<name attrs>children</name>`: each child escaped unless it is `Html`, each attribute value escaped.

    An attribute `class_` is written `class`, `data_x` `data-x`; a value of True is written bare, None or
    False leaves the attribute out. A void element (`br`, `hr`) takes no children."""
    parts = [name]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        key = key.rstrip("_").replace("_", "-")
        parts.append(key if value is True else f'{key}="{e(value)}"')
    opening = "<" + " ".join(parts) + ">"
    if name in ("br", "hr"):
        return Html(opening)
    return Html(opening + "".join(e(c) for c in children) + f"</{name}>")


def join(items: Iterable[object]) -> Html:
    """The items one after another, each escaped unless it is `Html`."""
    return Html("".join(e(i) for i in items))


def num(x: Any, digits: int = 4) -> str:
    """A number to `digits` significant figures (an integer whole, a bool 'yes'/'no'); '—' for None/NaN."""
    if x is None:
        return "—"
    if isinstance(x, bool) or type(x).__name__ == "bool_":
        return "yes" if x else "no"
    if isinstance(x, int) or type(x).__name__.startswith(("int", "uint")):
        return str(int(x))
    try:
        value = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f"{value:.{digits}g}" if math.isfinite(value) else "—"


def interval(low: Any, high: Any) -> str:
    """'[low, high]' (each to 3 significant figures), '' when both are undefined."""
    if num(low) == "—" and num(high) == "—":
        return ""
    return f"[{num(low, 3)}, {num(high, 3)}]"


def cell(x: Any) -> Html:
    """One table cell: a number formatted by `num`, other text cut at `MAX_TEXT` (all of it on hover)."""
    if isinstance(x, (list, tuple, dict)):
        x = str(x)
    if isinstance(x, str):
        if len(x) > MAX_TEXT:
            return tag("td", x[:MAX_TEXT] + "…", title=x)
        return tag("td", x)
    return tag("td", num(x), class_="n")


def table(headers: Sequence[object], rows: Iterable[Sequence[Any]], caption: str | None = None) -> Html:
    """A plain table; every header and cell escaped, numbers by `num`."""
    head = tag("thead", tag("tr", join(tag("th", h) for h in headers)))
    body = tag("tbody", join(tag("tr", join(cell(c) for c in row)) for row in rows))
    return tag("table", tag("caption", caption) if caption else Html(""), head, body)


def headline(summary: Any) -> Html:
    """The headline numbers of a `summary()`: a frame of `value` (and `low`, `high`, `n`) by headline name
    as one line each, 'value [low, high]'; a list of records as a table; a dict's scalars as a list;
    text as it is."""
    if summary is None:
        return Html("")
    if hasattr(summary, "columns") and "value" in summary.columns:
        cols = list(summary.columns)
        bounds = "low" in cols and "high" in cols
        rest = [c for c in cols if c not in ("value", "low", "high", "n")]
        rows = []
        for name, rec in summary.iterrows():
            rows.append([str(name), num(rec["value"]), *([interval(rec["low"], rec["high"])] if bounds else []),
                         *([num(rec["n"])] if "n" in cols else []), *(rec[c] for c in rest)])
        headers = [summary.index.name or "headline", "value", *(["interval"] if bounds else []),
                   *(["n"] if "n" in cols else []), *rest]
        return table(headers, rows, "headline numbers (.summary())")
    if hasattr(summary, "to_dict") and hasattr(summary, "columns"):
        summary = summary.to_dict("records")
    if isinstance(summary, str):
        return tag("pre", summary)
    if isinstance(summary, Mapping):
        scalars = [(k, v) for k, v in summary.items() if not isinstance(v, (list, tuple, dict))]
        return tag("dl", join(join([tag("dt", k), tag("dd", num(v) if not isinstance(v, str) else v)])
                              for k, v in scalars))
    records = [dict(r) for r in summary if isinstance(r, Mapping)]
    if not records:
        return Html("")
    keys = list(dict.fromkeys(k for r in records for k in r))
    return table(keys, ([r.get(k) for k in keys] for r in records[:TOP_ROWS]))


def frame_table(frame: Any, rank: str | None = None, top: int = TOP_ROWS) -> Html:
    """The first `top` rows of a DataFrame, or the `top` of largest |`rank`| (NaN last) when `rank` names
    one of its columns; the caption says which and out of how many."""
    n = len(frame)
    if rank is not None and rank in frame.columns:
        order = frame[rank].abs().sort_values(ascending=False, na_position="last").index
        shown = frame.loc[order[:top]]
        caption = f"top {min(top, n)} of {n} rows by |{rank}|"
    else:
        shown = frame.head(top)
        caption = f"first {min(top, n)} of {n} rows" if n > top else f"{n} rows"
    keep_index = type(frame.index).__name__ != "RangeIndex"
    headers = [*([frame.index.name or ""] if keep_index else []), *map(str, frame.columns)]
    rows = ([*([idx] if keep_index else []), *rec] for idx, rec in zip(shown.index, shown.itertuples(index=False)))
    return table(headers, rows, caption + " (all of them: .to_frame())")


def svg(fig: Any) -> Html:
    """A matplotlib figure as inline SVG markup (its text escaped by matplotlib's SVG writer); the figure
    is closed, so a notebook does not show it a second time."""
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    try:
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    finally:
        plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    start, end = text.find("<metadata>"), text.find("</metadata>")  # matplotlib's RDF credits, not a figure
    return Html(text[:start] + text[end + len("</metadata>"):] if 0 <= start < end else text)


CSS = (".rl-view{font:13px/1.4 system-ui,sans-serif;max-width:100%;overflow-x:auto}"
       ".rl-view h4{margin:4px 0;font-size:14px}.rl-view .doc{color:#555;margin:2px 0 6px}"
       ".rl-view table{border-collapse:collapse;margin:4px 0 8px}.rl-view caption{text-align:left;color:#666;"
       "font-size:12px}.rl-view th,.rl-view td{border-bottom:1px solid #ddd;padding:2px 8px;text-align:left}"
       ".rl-view td.n{text-align:right;font-variant-numeric:tabular-nums}.rl-view svg{max-width:100%;height:auto}"
       ".rl-view .toks{font-family:ui-monospace,monospace;white-space:pre-wrap;line-height:1.9}"
       ".rl-view .tok{padding:1px 0;border-radius:2px}.rl-view .tok.read{outline:2px solid #222}"
       ".rl-view .tok.tpl{font-style:italic;border-bottom:1px dotted #999}"
       ".rl-view .sides{display:grid;grid-template-columns:1fr 1fr;gap:12px}"
       ".rl-view .legend{display:flex;gap:6px;align-items:center;font-size:12px;color:#444}"
       ".rl-view .legend .bar{display:inline-block;width:120px;height:10px}"
       ".rl-view dl.facts{display:grid;grid-template-columns:max-content auto;gap:0 12px;margin:4px 0}"
       ".rl-view dl.facts dd{margin:0}.rl-view .text{white-space:pre-wrap}.rl-view details{margin:4px 0}"
       ".rl-view summary{cursor:pointer;font-weight:600}")


def view(title: str, doc: str, *blocks: Html) -> Html:
    """The frame every view shares: a scoped style, the title, what it is, then the blocks."""
    return tag("div", tag("style", Html(CSS)), tag("h4", title), tag("p", doc, class_="doc") if doc else Html(""),
               *blocks, class_="rl-view")


def first_line(obj: Any) -> str:
    """The first line of `obj`'s class docstring ('' when it has none)."""
    doc = (type(obj).__doc__ or "").strip()
    return doc.split("\n\n")[0].replace("\n", " ")


def result_html(result: Any) -> Html:
    """The view of one result: title and docstring line, headline numbers, top rows, its body (the plot)."""
    summary = result.summary() if callable(getattr(result, "summary", None)) else None
    names = getattr(result, "_html_top_names", None)
    if names is not None:
        rows_html = table(names, result.top(TOP_ROWS), f"top {TOP_ROWS} as .top() ranks them")
    elif getattr(result, "_html_table", True) and callable(getattr(result, "to_frame", None)):
        frames = result.to_frame()  # one frame, or several (a graph's nodes and edges)
        rank = getattr(result, "_html_rank", None)
        rows_html = join(frame_table(f, rank) for f in (frames if isinstance(frames, tuple) else (frames,)))
    else:
        rows_html = Html("")
    body = result._html_body() if hasattr(result, "_html_body") else Html("")
    return view(type(result).__name__, first_line(result), headline(summary), rows_html, body)


class HtmlView:
    """What makes a result render in a notebook: `_repr_html_` is `result_html(self)`.

    A result may set `_html_top_names` (the columns of the tuples its `top(n)` returns: the view then shows
    its own ranking), or `_html_rank` (the `to_frame()` column its top rows are ranked by, by |value|), and
    override `_html_body` (what follows the numbers: by default its `plot()` as SVG)."""

    _html_top_names: ClassVar[tuple[str, ...] | None] = None
    _html_rank: ClassVar[str | None] = None
    _html_table: ClassVar[bool] = True
    """False: the view shows no rows of `to_frame()` (its body shows them better, e.g. the token view)."""

    def _html_body(self) -> Html:
        plot = getattr(self, "plot", None)
        return tag("div", svg(plot()), class_="plot") if callable(plot) else Html("")

    def _repr_html_(self) -> str:
        return result_html(self)


def facts(items: Iterable[tuple[str, object]]) -> Html:
    """A definition list of (name, value): numbers by `num`, text as it is (escaped)."""
    return tag("dl", join(join([tag("dt", k), tag("dd", v if isinstance(v, str) else num(v))]) for k, v in items),
               class_="facts")


def pair_view(title: str, prompt: Sequence[tuple[str, str]], chosen: str, rejected: str,
              about: Iterable[tuple[str, object]]) -> Html:
    """A preference pair: its facts (id, subset, ...), the prompt's turns (role, text), then the chosen and
    the rejected response side by side; every text escaped."""
    turns = join(tag("p", tag("b", f"{role}: "), text, class_="turn") for role, text in prompt)
    sides = tag("div", tag("div", tag("h5", "chosen"), tag("p", chosen, class_="text")),
                tag("div", tag("h5", "rejected"), tag("p", rejected, class_="text")), class_="sides")
    return view(title, "", facts(about), turns, sides)


class CompositeView:
    """What makes a result made of results render in a notebook (an audit): its scalar fields as facts, a
    list's length, then each field that renders (`_repr_html_`) as its own view in a collapsed section (the
    first one open)."""

    def _repr_html_(self) -> str:
        import dataclasses

        about: list[tuple[str, object]] = []
        parts: list[Html] = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]  # a mixin of dataclasses only
            value = getattr(self, f.name)
            if hasattr(value, "_repr_html_"):
                opened = not parts
                parts.append(tag("details", tag("summary", f"{f.name}: {type(value).__name__}"),
                                 Html(value._repr_html_()), open=opened))
            elif isinstance(value, (str, int, float)) and not isinstance(value, bool) and len(str(value)) < 200:
                about.append((f.name, value))
            elif isinstance(value, (list, tuple, dict)) and value:
                about.append((f"{f.name} (count)", len(value)))
        return view(type(self).__name__, first_line(self), facts(about), *parts)
