"""The report holds a benchmark: at 21 subsets (and at 1) the page, rendered by headless Chromium, does
not overflow sideways; `#subset=NAME` narrows every per-pair section to that subset; long tables show
their top rows (the owner's ranking, checked against a naive sort) with the rest a click away; a click on
a header sorts, the filter box filters and ▸ opens a pair's drill-down; no figure legend covers an axis."""

import os
import shutil
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Audit
from rewardlens.audit.report import figures, write_report
from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir
from tests.audit.test_report import REPO
from tests.helpers.browser import chromium

NAMES = [f"set-{k:02d}" for k in range(21)]
PER_SUBSET = 2
TOKEN_PAIRS = 12  # as many as the audit attributes (`_whole.TOKEN_PAIRS`), the largest |margin| first
NARROWED = ("scores", "subsets", "crystallization", "attribution", "tokens")


def _audit(model, names: list[str], per: int) -> Audit:
    """A cheap audit of len(names) × per pairs (demo model; no probes, concepts or divergence)."""
    pairs = [replace(AUDIT_PAIRS[i % len(AUDIT_PAIRS)], subset=names[i // per], id=f"p{i}",
                     rejected=AUDIT_PAIRS[i % len(AUDIT_PAIRS)].rejected + f" ({i})")
             for i in range(len(names) * per)]
    lens = rl.lens(model, pairs)
    m = lens.reward[0::2] - lens.reward[1::2]
    shown = [int(i) for i in sorted(range(len(pairs)), key=lambda i: -abs(m[i]))[:TOKEN_PAIRS]]
    return Audit(model=repr(model), fingerprint="fp", data_checksum="sum", pair_ids=[p.id for p in pairs], lens=lens,
                 sublayers=rl.attribute(model, pairs), heads=rl.attribute(model, pairs, level="head"),
                 faithfulness=rl.faithfulness(model, pairs, level="head"), subsets=[p.subset for p in pairs],
                 tokens=rl.tokens(model, [pairs[i] for i in shown]), token_pairs=shown)


@pytest.fixture(scope="module")
def model():
    return rl.load(str(demo_model_dir()))


@pytest.fixture(scope="module")
def bench(model):
    return _audit(model, NAMES, PER_SUBSET)


@pytest.fixture(scope="module")
def page(bench, tmp_path_factory):
    return write_report(bench, tmp_path_factory.mktemp("bench") / "out")


class Dom(HTMLParser):
    """Per section: every element with `data-subset` (tag, subset, hidden); the body's attributes; each
    table's rows (pair ids of the scores table, hidden or not); drill-down rows."""

    def __init__(self, text: str):
        super().__init__()
        self.section, self.body, self.marked = "", {}, []
        self.pairs: list[tuple[str, bool]] = []
        self.drills: list[bool] = []
        self._row: dict | None = None
        self._cell = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "section":
            self.section = a.get("id", "")
        if "data-subset" in a and tag != "body":
            self.marked.append((self.section, tag, a["data-subset"], "hidden" in a))
        if tag == "tr" and self.section == "scores" and a.get("class") == "drill":
            self.drills.append("hidden" in a)
        elif tag == "tr" and self.section == "scores" and "data-subset" in a:
            self._row, self._cell = {"hidden": "hidden" in a, "text": []}, 0
        elif tag == "td" and self._row is not None:
            self._cell += 1

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None:
            self.pairs.append(("".join(self._row["text"]).strip(), self._row["hidden"]))
            self._row = None

    def handle_data(self, data):
        if self._row is not None and self._cell == 3:  # ▸ | # | pair id
            self._row["text"].append(data)


def _dom(page: Path, tmp: Path, name: str, width: int = 1280, hash_: str = "") -> Dom:
    target = tmp / f"{name}.html"
    shutil.copy(page, target)
    args = [f"--window-size={width},900", "--dump-dom"]
    if not hash_:
        return Dom(chromium(args, target, tmp / f"profile-{name}").stdout)
    # Chromium takes a file path, not a URL with a fragment: a one-line page forwards to it.
    jump = tmp / f"{name}-jump.html"
    jump.write_text(f'<script>location.replace("{target.name}#{hash_}")</script>', encoding="utf-8")
    return Dom(chromium(args, jump, tmp / f"profile-{name}").stdout)


def _screenshot(page: Path, tmp: Path, height: int) -> None:
    """The whole page at 1280 px, kept in test-artifacts/ to be looked at (as test_report.py keeps its own)."""
    artifacts = Path(os.environ.get("REWARDLENS_ARTIFACTS", REPO / "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "report-21-subsets.png"
    shot.unlink(missing_ok=True)
    chromium([f"--window-size=1280,{min(height, 16000)}", f"--screenshot={shot}"], page, tmp / "profile-shot")
    shutil.copy(page, artifacts / "report-21-subsets.html")
    assert shot.stat().st_size > 10_000


def _margins(audit: Audit) -> np.ndarray:
    return np.asarray(audit.lens.reward[0::2] - audit.lens.reward[1::2], dtype=np.float64)


def test_no_horizontal_overflow_and_long_tables_show_their_top_rows(bench, page, tmp_path):
    for width in (900, 1280):
        dom = _dom(page, tmp_path, f"plain-{width}", width)
        assert int(dom.body["data-scroll-width"]) <= int(dom.body["data-inner-width"]) == width
    _screenshot(page, tmp_path, int(dom.body["data-page-height"]))
    m = _margins(bench)
    top = {f"p{i}" for i in sorted(range(len(m)), key=lambda i: -abs(m[i]))[:10]}  # naive: the 10 largest |margin|
    assert {p for p, hidden in dom.pairs if not hidden} == top and len(dom.pairs) == len(m)
    for section in ("subsets", "crystallization", "attribution"):  # 21 rows each: the first 10 by name, then a click
        rows = [(s, hidden) for sec, tag, s, hidden in dom.marked if sec == section and tag == "tr"]
        assert [s for s, _ in rows] == NAMES
        assert [s for s, hidden in rows if not hidden] == NAMES[:10]
    assert all(dom.drills)  # every drill-down starts closed


def test_picking_a_subset_narrows_every_per_pair_section(bench, page, tmp_path):
    m = _margins(bench)
    pick = bench.subsets[int(np.argmax(np.abs(m)))]  # its pair is among the attributed tokens
    dom = _dom(page, tmp_path, "pick", hash_=f"subset={pick}")
    assert dom.body["data-subset"] == pick
    for section in NARROWED:
        marked = [(s, hidden) for sec, _, s, hidden in dom.marked if sec == section]
        assert any(s == pick for s, _ in marked), section
        assert all(hidden == (s != pick) for s, hidden in marked), section
    mine = {f"p{i}" for i, s in enumerate(bench.subsets) if s == pick}
    assert {p for p, hidden in dom.pairs if not hidden} == mine  # even a pair the collapsed table hid
    assert int(dom.body["data-scroll-width"]) <= int(dom.body["data-inner-width"])


INTERACT = """<script>
(function(){
  var s=document.getElementById('scores'), box=s.querySelector('.tbl'), t=box.querySelector('table');
  var th=Array.prototype.filter.call(t.tHead.rows[0].cells,function(h){return h.textContent==='margin';})[0];
  th.click();
  function ids(){return Array.prototype.filter.call(t.tBodies[0].rows,
    function(r){return !r.classList.contains('drill');})
    .map(function(r){return r.cells[2].textContent+(r.hidden?'-':'+');}).join(' ');}
  document.body.setAttribute('data-sorted', ids());
  var f=box.querySelector('input.filter'); f.value='p17'; f.dispatchEvent(new Event('input'));
  document.body.setAttribute('data-filtered', ids()); f.value=''; f.dispatchEvent(new Event('input'));
  box.querySelector('.show-all').click(); document.body.setAttribute('data-opened', ids());
  t.tBodies[0].rows[0].querySelector('.open-pair').click();
  var d=t.tBodies[0].rows[1];
  document.body.setAttribute('data-drill', (d.hidden?'closed ':'open ')+d.querySelectorAll('tr').length);
})();
</script></body>"""


def test_tables_sort_filter_open_and_drill_down(bench, page, tmp_path):
    driven = tmp_path / "source.html"
    driven.write_text(page.read_text(encoding="utf-8").replace("</body>", INTERACT), encoding="utf-8")
    body = _dom(driven, tmp_path, "driven").body
    m = _margins(bench)
    order = [f"p{i}" for i in sorted(range(len(m)), key=lambda i: float(f"{m[i]:.3g}"))]  # the cells' 3 digits
    sorted_ids = [x[:-1] for x in body["data-sorted"].split()]
    assert [float(f"{m[int(p[1:])]:.3g}") for p in sorted_ids] == [float(f"{m[int(p[1:])]:.3g}") for p in order]
    assert [x for x in body["data-filtered"].split() if x.endswith("+")] == ["p17+"]
    assert all(x.endswith("+") for x in body["data-opened"].split()) and len(body["data-opened"].split()) == len(m)
    state, rows = body["data-drill"].split()
    # the first sorted pair's drill-down: its top parts (header + 5) and its tokens table or a note
    assert state == "open" and int(rows) >= 6


def test_drill_down_holds_the_pairs_own_numbers(bench):
    from rewardlens.audit.report._pairs import DRILL_PARTS, drill

    f, i = bench.faithfulness, bench.token_pairs[0]
    got = drill(bench, i)
    naive = sorted(range(len(f.names)), key=lambda j: -abs(f.total[i, j]))[:DRILL_PARTS]  # one pair: mean |x| = |x|
    for j in naive:
        assert f">{f.names[j]}<" in got and f"{f.total[i, j]:.3g}" in got
    t = bench.tokens
    values = t.values[0]  # pair `i` is the first attributed one: its chosen side is row 0
    best = int(np.argmax(np.abs(values)))
    assert f"{float(values[best]):.3g}" in got and "did not attribute" not in got
    assert "did not attribute" in drill(bench, next(k for k in range(len(f.total)) if k not in bench.token_pairs))


def test_one_subset(model, tmp_path):
    one = _audit(model, ["only"], 8)
    page = write_report(one, tmp_path / "one")
    dom = _dom(page, tmp_path, "one", hash_="subset=only")
    assert dom.body["data-subset"] == "only"
    assert int(dom.body["data-scroll-width"]) <= int(dom.body["data-inner-width"])
    assert len(dom.pairs) == 8 and not any(hidden for _, hidden in dom.pairs)
    assert {sec for sec, *_ in dom.marked} == set(NARROWED) and not any(h for *_, h in dom.marked)


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("name", ["fig_lens", "fig_crystallization", "fig_estimands", "fig_scatter"])
def test_no_legend_covers_an_axis(bench, name):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = getattr(figures, name)(bench)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    assert legends, name
    if name == "fig_scatter":  # moved out, the result's own legend keeps every entry
        assert [t.get_text() for t in legends[0].get_texts()] == ["embed", "attn", "mlp", "y = x"]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:  # the axes, and their ticks and labels
            for part in (ax, ax.xaxis, ax.yaxis):
                got = part.get_window_extent(renderer) if part is ax else part.get_tightbbox(renderer)
                assert got is None or not _overlaps(box, got), (name, ax.get_title(), type(part).__name__)
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height  # on the page
