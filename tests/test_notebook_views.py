"""Every result renders in a notebook: a notebook executed by a real Jupyter kernel (nbclient) ends a cell in
each result class, in `Pair`, `RewardModel` and `Audit`, and the test reads the `text/html` each cell displayed.

Each view must be well-formed HTML with no script, show its headline numbers (each checked against numbers the
kernel read from the result's own fields, not from the view), and keep text planted in the data (`<script>` in a
pair's response, markup in a concept's name) as text. The token view is then drawn by headless Chromium.
"""

from __future__ import annotations

import io
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.browser import chromium

REPO = Path(__file__).resolve().parents[1]
SCRIPT = '<script>alert("pwned")</script>'
MARKUP = "<b>polite</b>"
VOID = {"br", "hr", "img", "input", "meta", "link"}

SETUP = f"""
import json, math, sys
from pathlib import Path
import numpy as np
import torch
torch.set_num_threads(1)
sys.path.insert(0, {str(REPO)!r})
import rewardlens as rl
from rewardlens.audit import Audit
from rewardlens.audit._graph import audit_graphs
from rewardlens.graphs import graph
from rewardlens.loop import Recipe, verify_edit
from rewardlens.zoo import build_tokenizer
from rewardlens.zoo.organisms import build
from tests.graphs.conftest import SHORT, random_transcoders
from tests.helpers import tiny
from tests.helpers.results import POLITE, every_result

root = Path(ROOT_DIR)
model = rl.load(str(tiny.build("llama", build_tokenizer(), root)))
pairs = [*tiny.PAIRS[:2], rl.Pair("Say hi.", {"Hi! " + SCRIPT!r}, {"Bye " + MARKUP!r}, id={"evil " + SCRIPT!r})]
results = every_result(model, pairs, rl.load(str(build("sycophancy", strength=1.0))))
results["Concepts"] = rl.concepts(model, {{{MARKUP!r}: POLITE["polite"]}}, n_boot=50)
results["Audit"] = Audit(model=repr(model), fingerprint="fp", data_checksum="sum",
                         pair_ids=[str(i) for i in range(3)], lens=results["Lens"],
                         sublayers=rl.attribute(model, pairs), heads=results["Attribution"],
                         faithfulness=rl.faithfulness(model, pairs, level="head", n_boot=50),
                         tokens=results["TokenAttribution"])
transcoders = random_transcoders(model)
paired = graph(model, SHORT, transcoders, max_nodes=40, batch_size=16)[0]
results["AttributionGraph"], results["PairGraph"] = paired.margin, paired
results["AuditGraphs"] = audit_graphs(model, pairs, [0, 1], None, 4)  # the audit's graph section, by neurons
feature = next(n for n, k in zip(paired.chosen.nodes.names, paired.chosen.nodes.kind) if k == 0)
results["InterventionCheck"] = paired.chosen.intervene(model, transcoders, {{feature: "ablate"}})
results["ClosedLoop"] = verify_edit(("list",), seeds=(0, 1), recipe=Recipe(grpo_steps=5))
results["Pair"] = pairs[-1]
results["RewardModel"] = model
"""

# The numbers each view must show, read from the result's own fields in the kernel (`fmt` is '%.4g', the
# precision of the views). A class not named here is held by the summary and top-row rules in `expected`.
EXPECT = r'''
def fmt(x):
    return f"{float(x):.4g}"

def mean_abs_top(values, names):
    score = np.abs(np.asarray(values, dtype=float)).mean(0)
    i = int(np.nanargmax(score))
    return [str(names[i])]

def expected(name, r):
    out = []
    summary = r.summary() if callable(getattr(r, "summary", None)) else None
    if hasattr(summary, "columns") and "value" in summary.columns:
        out += [fmt(v) for v in summary["value"] if isinstance(v, (int, float, np.number)) and math.isfinite(v)]
    elif isinstance(summary, list):
        out += [fmt(v) for rec in summary for k, v in rec.items()
                if k in ("rho", "value", "slope", "difference") and isinstance(v, float) and math.isfinite(v)]
    if name == "Attribution":
        out += mean_abs_top(r.values, r.names) + [fmt(np.abs(r.values).mean(0).max())]
    elif name == "Patching":
        i = int(np.nanargmax(np.abs(r.effect).mean(0)))
        out += [r.names[i], fmt(r.effect.mean(0)[i])]
    elif name == "Probes":
        i = int(np.nanargmax(np.abs(r.mean)))
        out += [r.axes[i], fmt(r.mean[i])]
    elif name == "Parity":
        out += [c.name for c in r.checks]
    elif name == "Bench":
        out += [str(s) for s in r.to_frame()["subset"]]
    elif name == "TokenAttribution":
        out += [f"{v:+.4g} reward units" for v in r.values[0]] + [f"{r.reward[0]:+.4g}"]
    elif name == "Pair":
        out += ["Say hi.", "Hi! "]
    elif name == "RewardModel":
        out += [r.arch.name, str(r.device), "float32", r.kind.name, "last real token"]
    elif name == "Audit":
        out += ["Lens", "Faithfulness", "fingerprint"]
    return out

print("EXPECTED=" + json.dumps({k: expected(k, v) for k, v in results.items()}))
'''


class Page(HTMLParser):
    """Tags in order: every opened element closed in order (void and self-closed ones aside), scripts counted."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.scripts = 0
        self.links: list[str] = []
        self.text: list[str] = []
        self.titles: list[str] = []
        self.spans: list[tuple[str, str]] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.scripts += tag == "script"
        if any(k.startswith("on") for k in a):
            self.errors.append(f"event handler on <{tag}>")
        self.links += [v for k, v in attrs if k in ("src", "href", "xlink:href") and v and not
                       v.startswith(("#", "data:"))]
        if "title" in a:
            self.titles.append(a["title"])
        if tag == "span" and "tok" in (a.get("class") or "").split():
            self.spans.append((a["class"], a["style"]))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """{cell name: the text/html it displayed}, and {name: the numbers its view must show}."""
    import nbformat
    from nbclient import NotebookClient

    root = tmp_path_factory.mktemp("nbmodels")
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(SETUP.replace("ROOT_DIR", repr(str(root)))))
    names = ["Lens", "Attribution", "TokenAttribution", "Patching", "Faithfulness", "Concepts", "Conflicts",
             "EditReport", "Edit", "Probes", "Distortion", "Cascades", "FeatureAttribution", "FeatureReport",
             "TrainResult", "Comparison", "Trajectory", "PolicyRun", "Bench", "BenchComparison", "PathPatching",
             "Circuit", "Edges", "Steps", "Scorecard", "Parity", "FeaturePatch", "FeatureSteer", "FeatureCards",
             "ClosedLoop", "AttributionGraph", "PairGraph", "InterventionCheck", "AuditGraphs",
             "Pair", "RewardModel", "Audit"]
    for name in names:  # the cell's last expression is the result: Jupyter displays it by its _repr_html_
        nb.cells.append(nbformat.v4.new_code_cell(f"# {name}\nresults[{name!r}]"))
    nb.cells.append(nbformat.v4.new_code_cell(EXPECT))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    shown = {}
    for cell in nb.cells[1:-1]:
        name = cell.source.split("\n")[0][2:]
        out = [o for o in cell.outputs if o.get("output_type") == "execute_result"]
        assert len(out) == 1 and "text/html" in out[0]["data"], (name, cell.outputs)
        shown[name] = out[0]["data"]["text/html"]
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    expected = json.loads(printed.split("EXPECTED=", 1)[1])
    return shown, expected, names


def _result_classes() -> set[tuple[str, str]]:
    """(module, name) of every dataclass in the package's source with a `to_frame` or a `plot` (read with `ast`)."""
    import ast

    import rewardlens as rl

    root = Path(rl.__file__).parent
    out = set()
    for path in root.rglob("*.py"):
        module = ".".join(["rewardlens", *path.relative_to(root).with_suffix("").parts])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and {"to_frame", "plot"} & {
                    f.name for f in node.body if isinstance(f, ast.FunctionDef)} and any(
                    "dataclass" in ast.unparse(d) for d in node.decorator_list):
                out.add((module, node.name))
    return out


def test_every_result_class_renders():
    """Every result class (a dataclass with `to_frame` or `plot`) has the notebook view, so a new one cannot be
    left without it."""
    import importlib

    from rewardlens.plotting import HtmlView

    bare = [f"{m}.{n}" for m, n in sorted(_result_classes())
            if not issubclass(getattr(importlib.import_module(m), n), HtmlView)]
    assert not bare, f"result classes without the notebook view (subclass rewardlens.plotting.HtmlView): {bare}"


def test_every_result_class_is_in_the_notebook(executed):
    _, _, names = executed
    missing = {n for _, n in _result_classes()} - set(names) - {"TranscoderFidelity", "TranscoderTraining"}
    assert not missing, sorted(missing)


def test_every_view_is_well_formed_escaped_and_shows_its_numbers(executed):
    shown, expected, names = executed
    for name in names:
        page = Page(shown[name])
        assert not page.errors and not page.stack, (name, page.errors[:3], page.stack[-3:])
        assert page.scripts == 0, f"{name}'s view holds a <script>"
        assert not page.links and "url(http" not in shown[name], f"{name}'s view fetches {page.links[:3]}"
        text = "".join(page.text) + " ".join(page.titles)
        missing = [x for x in expected[name] if x not in text]
        assert not missing, f"{name}'s view lacks {missing[:5]} (of {len(expected[name])} expected)"
    for name in names:  # every view but the plain facts' draws its figure inline
        if name not in ("Pair", "RewardModel", "Edit", "Steps", "Scorecard", "Parity", "TokenAttribution", "Edges",
                        "InterventionCheck"):
            assert "<svg" in shown[name], f"{name}'s view has no inline figure"


def test_planted_markup_stays_text(executed):
    shown, _, _ = executed
    for name, planted in (("Pair", SCRIPT), ("Pair", MARKUP), ("Concepts", MARKUP)):
        page = Page(shown[name])
        assert planted in "".join(page.text) + " ".join(page.titles), (name, planted)
        assert planted not in shown[name], f"{name}: {planted} reached the page unescaped"
    tokens = Page(shown["TokenAttribution"])
    assert tokens.scripts == 0 and "<script>" not in shown["TokenAttribution"]


def test_token_view_colours_by_sign_and_sets_the_template_apart(executed):
    shown, _, _ = executed
    page = Page(shown["TokenAttribution"])
    styles = [style for cls, style in page.spans if "tpl" not in cls]
    assert any(s.startswith("background:rgb(255,") and not s.endswith(",255)") for s in styles)  # red: raises
    assert any(s.startswith("background:rgb(") and s.endswith(")") and int(s.split(",")[2][:-1]) > int(
        s.split("(")[1].split(",")[0]) for s in styles)  # blue: lowers
    assert any("tpl" in cls for cls, _ in page.spans), "no template token set apart"
    assert sum("read" in cls.split() for cls, _ in page.spans) >= 2  # each side's read token


@pytest.mark.slow
def test_token_view_renders_in_headless_chromium(executed, tmp_path):
    shown, _, _ = executed
    page = tmp_path / "tokens.html"
    page.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{shown['TokenAttribution']}"
                    "</body></html>", encoding="utf-8")
    shot = tmp_path / "tokens.png"
    chromium(["--window-size=1100,900", f"--screenshot={shot}"], page, tmp_path / "profile", what="the token view")
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(shot.read_bytes())).convert("RGB"), dtype=np.int64)
    r, b = image[..., 0], image[..., 2]
    assert np.asarray(Image.fromarray(image.astype(np.uint8)).convert("L"), dtype=float).std() > 10, "blank"
    reddish = ((r - b > 40) & (r > 200)).sum()
    bluish = ((b - r > 40) & (b > 150)).sum()
    assert reddish > 200 and bluish > 200, f"token backgrounds not drawn: {reddish} red, {bluish} blue pixels"
    assert math.isfinite(float(image.mean()))
