"""The page's building blocks: escaped text, numbers, tables, figures, and the plain-language line.

`Html` marks markup built here (already escaped); a plain `str` is escaped wherever it is inserted,
so text from the user or the model (pair ids, responses, concept names) can never become markup.
"""

from __future__ import annotations

import base64
import html
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
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


TOP_ROWS = 10
"""A table longer than this shows a filter box; one given its `top` rows shows only those until opened."""


def _row(cells: Iterable[object], cls: str, attrs: Mapping[str, str], toggle: bool, hidden: bool) -> str:
    extra = "".join(f' {k}="{e(v)}"' for k, v in attrs.items()) + (" hidden" if hidden else "")
    cls_attr = f' class="{e(cls)}"' if cls else ""
    lead = '<td><button type="button" class="open-pair" aria-expanded="false" title="this pair\'s parts, patching ' \
           'effects and tokens">▸</button></td>' if toggle else ""
    return f"<tr{cls_attr}{extra}>{lead}" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>"


def table(headers: Iterable[str], rows: Iterable[Iterable[object]], row_class: Iterable[str] | None = None, *,
          subsets: Sequence[str] | None = None, top: Iterable[int] | None = None,
          drill: Sequence[Html] | None = None) -> Html:
    """An HTML table, sortable by a click on a header (`SCRIPT`); cells are escaped unless they are `Html`.

    `subsets` [rows]: each row's subset (`data-subset`), so the page's subset selector narrows it; `top`:
    the rows shown while the table is collapsed (the caller's ranking owner picks them; the others are a
    click away); `drill` [rows]: markup each row expands to. A table of more than `TOP_ROWS` rows gets a
    filter box."""
    body_rows = [list(r) for r in rows]
    n = len(body_rows)
    classes = list(row_class) if row_class is not None else [""] * n
    keep = None if top is None else set(top)
    collapsed = keep is not None and len(keep) < n
    head = ('<th class="nosort"></th>' if drill is not None else "") + "".join(f"<th>{e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(body_rows):
        attrs = {} if subsets is None else {"data-subset": str(subsets[i])}
        more = collapsed and keep is not None and i not in keep
        if more:
            attrs["data-more"] = "1"
        body.append(_row(row, classes[i], attrs, drill is not None, more))
        if drill is not None:
            body.append(f'<tr class="drill" hidden><td colspan="{len(row) + 1}">{drill[i]}</td></tr>')
    controls = ""
    if n > TOP_ROWS:
        controls += '<input type="search" class="filter" placeholder="filter rows…" aria-label="filter rows">'
    if collapsed:
        controls += f'<button type="button" class="show-all">show all {n} rows</button>'
    if controls:
        controls = f'<div class="ctl">{controls}<span class="count"></span></div>'
    return Html(f'<div class="tbl" data-rows="{n}">{controls}<table><thead><tr>{head}</tr></thead>'
                f'<tbody>{"".join(body)}</tbody></table></div>')


def subset_picker(names: Sequence[str]) -> Html:
    """The page's subset selector: every element with `data-subset` shows only when its subset is picked."""
    options = "".join(f'<option value="{e(s)}">{e(s)}</option>' for s in names)
    return Html(f'<label class="picker">subset <select id="subset-picker"><option value="">all subsets</option>'
                f"{options}</select></label>")


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


CSS = """
.tbl{max-width:100%;overflow-x:auto}.tbl th:not(.nosort){cursor:pointer;user-select:none}
.tbl th[aria-sort=ascending]::after{content:" ▲";font-size:10px}.tbl th[aria-sort=descending]::after{content:" ▼";
font-size:10px}.ctl{display:flex;flex-wrap:wrap;gap:8px;align-items:center;font-size:12.5px;margin:8px 0 0}
.ctl .count{color:#555}.ctl input{font:inherit;padding:2px 6px;min-width:14em}button{font:inherit;cursor:pointer}
.open-pair{border:0;background:none;padding:0 2px;color:#1f3a5f}.open-pair[aria-expanded=true]{transform:rotate(90deg)}
tr.drill>td{background:#f7f9fb;padding:6px 14px 10px}.picker{float:right;color:#1f3a5f}.picker select{font:inherit}
"""

# One script for every table and the subset selector. It only shows, hides and reorders what the page
# already holds: every number is computed in Python by its owner. State composes per row: the picked subset
# (rows with another `data-subset` hide), the filter text, and a collapsed table's `data-more` rows (shown
# once opened, or when a filter or a subset asks for them). `#subset=NAME` in the URL picks a subset (a link
# that can be shared; the headless test uses it). It writes the page's width on <body> so a test can see
# overflow without a screenshot.
SCRIPT = """
(function(){
  var body=document.body, picked='', picker=document.getElementById('subset-picker');
  function rows(t){return Array.prototype.filter.call(t.tBodies[0].rows,function(r){
    return !r.classList.contains('drill');});}
  function refresh(box){
    var t=box.querySelector('table'), f=box.querySelector(':scope>.ctl>input.filter');
    var q=f?f.value.trim().toLowerCase():'', open=box.classList.contains('open'), shown=0, all=rows(t);
    all.forEach(function(r){
      var s=r.getAttribute('data-subset'), mine=s!==null&&picked!=='';
      var ok=(!mine||s===picked)&&(!q||r.textContent.toLowerCase().indexOf(q)>=0)
             &&(open||q!==''||mine||!r.hasAttribute('data-more'));
      r.hidden=!ok; if(ok){shown++;}
      var d=r.nextElementSibling;
      if(d&&d.classList.contains('drill')){d.hidden=!(ok&&r.classList.contains('expanded'));}
    });
    var c=box.querySelector(':scope>.ctl>.count');
    if(c){c.textContent='showing '+shown+' of '+all.length+' rows';}
  }
  function key(td){
    var t=td.textContent.trim(), x=parseFloat(t.replace(/\u2212/g,'-'));
    return isNaN(x)?[1,0,t.toLowerCase()]:[0,x,''];
  }
  function sort(th){
    var t=th.closest('table'), col=Array.prototype.indexOf.call(th.parentNode.children,th);
    var up=th.getAttribute('aria-sort')!=='ascending', tb=t.tBodies[0];
    Array.prototype.forEach.call(th.parentNode.children,function(h){h.removeAttribute('aria-sort');});
    th.setAttribute('aria-sort',up?'ascending':'descending');
    var items=rows(t).map(function(r){var d=r.nextElementSibling;
      return {r:r,d:d&&d.classList.contains('drill')?d:null,k:key(r.cells[col])};});
    items.sort(function(a,b){  // numbers first, then text; '—' (undefined) last either way
      if(a.k[0]!==b.k[0]){return a.k[0]-b.k[0];}
      var c=a.k[0]===0?a.k[1]-b.k[1]:(a.k[2]<b.k[2]?-1:a.k[2]>b.k[2]?1:0);
      return up?c:-c;});
    items.forEach(function(i){tb.appendChild(i.r); if(i.d){tb.appendChild(i.d);}});
  }
  function measure(){
    var w=document.documentElement.scrollWidth;
    body.setAttribute('data-scroll-width',String(w)); body.setAttribute('data-inner-width',String(window.innerWidth));
  }
  function pick(name){
    picked=name||''; body.setAttribute('data-subset',picked); if(picker){picker.value=picked;}
    document.querySelectorAll('.tbl').forEach(refresh);
    document.querySelectorAll('[data-subset]:not(tr):not(body)').forEach(function(el){
      el.hidden=picked!==''&&el.getAttribute('data-subset')!==picked;});
    measure();
  }
  document.querySelectorAll('.tbl').forEach(function(box){
    var t=box.querySelector('table');
    Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th){
      if(!th.classList.contains('nosort')){th.addEventListener('click',function(){sort(th);});}});
    var f=box.querySelector(':scope>.ctl>input.filter'), b=box.querySelector(':scope>.ctl>.show-all');
    if(f){f.addEventListener('input',function(){refresh(box);});}
    if(b){b.addEventListener('click',function(){var o=box.classList.toggle('open');
      b.textContent=o?'show the top rows':'show all '+box.getAttribute('data-rows')+' rows'; refresh(box);});}
    rows(t).forEach(function(r){var o=r.querySelector(':scope>td>.open-pair');
      if(o){o.addEventListener('click',function(){var x=r.classList.toggle('expanded');
        o.setAttribute('aria-expanded',String(x)); refresh(box);});}});
    refresh(box);
  });
  if(picker){picker.addEventListener('change',function(){pick(picker.value);
    try{history.replaceState(null,'',picked?'#subset='+encodeURIComponent(picked):location.pathname);}catch(err){}});}
  var m=/^#subset=(.*)$/.exec(location.hash);
  pick(m?decodeURIComponent(m[1]):'');
  window.addEventListener('load',measure);
})();
"""
