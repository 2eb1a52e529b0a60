"""The audit report: files, numbers against the results' own (per subset too, against a naive loop),
Parquet round-trips, escaping, and the page rendered by headless Chromium (every section present and
non-empty, every figure decoded, a response holding a script shown as text with no script run)."""

import base64
import html
import io
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rewardlens as rl
from rewardlens.audit import Audit
from rewardlens.audit.report import figures, plain, tables, write_report
from rewardlens.audit.report._page import SECTIONS
from rewardlens.errors import RewardLensError
from rewardlens.stats import wilson
from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir
from tests.helpers.browser import chromium

REPO = Path(__file__).resolve().parents[2]
FIGURES = {"lens", "scatter", "heatmap", "probes", "concepts", "features", "crystallization", "estimands", "cascades"}
EVIL = '<script>alert("pwned")</script> & "quotes"'
SCRIPT = "<script>alert(1)</script>"
# A response that would run script if any of it reached the page as markup: it marks <body>.
EVIL_RESPONSE = (f"Sure. {SCRIPT} <script>document.body.setAttribute('data-pwned','1')</script>"
                 "<img src=x onerror=\"document.body.setAttribute('data-pwned','2')\">")
SUBSETS = ["chat", "chat", "safety", "math-prm", "safety", "chat", None, "math-prm"]
PAIRS = [replace(p, subset=s, chosen=EVIL_RESPONSE if i == 2 else p.chosen)
         for i, (p, s) in enumerate(zip(AUDIT_PAIRS, SUBSETS, strict=True))]
NEW_SECTIONS = ("subsets", "crystallization", "estimands", "divergence", "tokens", "distortion", "cascades")
SAE_LAYER = 0


@pytest.fixture(scope="module")
def model():
    return rl.load(str(demo_model_dir()))


@pytest.fixture(scope="module")
def audit(model):
    pairs = PAIRS
    ids = [f"pair-{i}" for i in range(len(pairs))]
    ids[1] = EVIL  # pair ids are user input
    # An untrained SAE: feature attribution is exact for any dictionary, which is all the report needs.
    sae = rl.sae.TopKSAE(model.d_model, rl.sae.SAEConfig(num_latents=64, k=4), seed=0)
    probes = rl.probe(model)
    return Audit(
        model=repr(model), fingerprint="fp<1>", data_checksum="sum&2", pair_ids=ids,
        lens=rl.lens(model, pairs), sublayers=rl.attribute(model, pairs),
        heads=rl.attribute(model, pairs, level="head"),
        faithfulness=rl.faithfulness(model, pairs, level="head"), probes=probes, concepts=rl.concepts(model),
        features=rl.attribute_features(model, sae, pairs, layer=SAE_LAYER), subsets=SUBSETS,
        tokens=rl.tokens(model, pairs), token_pairs=list(range(len(pairs))),
        divergence=rl.patch(model, pairs, level="head", divergence=True),
        distortion=rl.hacking.distortion(probes), cascades=rl.hacking.cascade(probes),
    )


@pytest.fixture(scope="module")
def report(audit, tmp_path_factory):
    return write_report(audit, tmp_path_factory.mktemp("report") / "out")


@pytest.fixture(scope="module")
def numbers(report):
    def strict(token):
        raise AssertionError(f"numbers.json holds {token}, which is not JSON")

    return json.loads((report.parent / "numbers.json").read_text(encoding="utf-8"), parse_constant=strict)


class Page(HTMLParser):
    """Sections, figures, images and scripts of an HTML document, with their attributes."""

    def __init__(self, text: str):
        super().__init__()
        self.sections, self.figures, self.images, self.scripts, self.body = {}, {}, [], [], {}
        self.notrun, self.how, self._section = set(), set(), None
        self.text: dict[str, str] = {}
        self.tokens: list[str] = []  # the text of each token box (div.toks), as the page shows it
        self._in_tokens = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._section = a.get("id")
            self.sections[self._section] = a
        elif tag == "figure":
            self.figures[a.get("id")] = {**a, "section": self._section}
        elif tag == "img":
            self.images.append(a)
        elif tag == "script":
            self.scripts.append(a)
        elif tag == "body":
            self.body = a
        elif tag == "p" and "notrun" in (a.get("class") or ""):
            self.notrun.add(self._section)
        elif tag == "p" and "how" in (a.get("class") or "").split():
            self.how.add(self._section)
        elif tag == "div" and a.get("class") == "toks":
            self._in_tokens = True
            self.tokens.append("")

    def handle_endtag(self, tag):
        if tag == "div":
            self._in_tokens = False  # a token box holds spans only: its div closes first

    def handle_data(self, data):
        if self._section is not None:
            self.text[self._section] = self.text.get(self._section, "") + data
        if self._in_tokens:
            self.tokens[-1] += data


def test_files_are_written(report, numbers):
    out = report.parent
    assert report.name == "report.html" and report.is_file()
    listed = {name: t["file"] for name, t in numbers["tables"].items()}
    assert set(listed) == {"scores", "lens", "sublayers", "heads", "faithfulness", "faithfulness_summary", "probes",
                           "probe_items", "concepts", "concept_dose", "concept_summary", "features", "subsets",
                           "estimands", "divergence", "distortion", "cascades", "tokens"}
    assert {p.name for p in out.glob("*.parquet")} == set(listed.values())
    assert not list(out.glob("*.tmp"))


def test_numbers_equal_the_results_own(audit, numbers):
    r = audit.lens.reward.astype(np.float64)
    margin = r[0::2] - r[1::2]
    assert numbers["n_pairs"] == len(PAIRS)
    assert numbers["scores"]["accuracy"] == pytest.approx(np.mean(margin > 0))
    assert numbers["scores"]["accuracy_ci"] == pytest.approx(list(wilson(int((margin > 0).sum()), len(margin))))
    assert numbers["scores"]["mean_margin"] == pytest.approx(margin.mean())
    for kind in ("linear", "normed"):
        depth = audit.lens.crystallization(kind, audit.fraction)
        assert numbers["lens"]["crystallization_median"][kind] == pytest.approx(np.nanmedian(depth))
    closure = numbers["closure_error"]
    assert closure["sublayers"] == pytest.approx(np.abs(audit.sublayers.residual_error).max())
    assert closure["heads"] == pytest.approx(np.abs(audit.heads.residual_error).max())
    assert closure["max"] >= max(closure["sublayers"], closure["heads"], closure["features"])
    assert closure["max"] < 1e-4  # the parts sum to the reward (fp32 demo model)
    f = audit.faithfulness
    for est in ("direct", "total", "indirect", "attribution_patching"):
        pooled = numbers["faithfulness"]["pooled"][est]
        assert [pooled["rho"], pooled["lo"], pooled["hi"]] == pytest.approx(list(f.pooled(est)))
    seed = numbers["faithfulness"]["seed_statistic"]
    assert [seed["rho"], seed["lo"], seed["hi"]] == pytest.approx(list(f.seed_statistic()))
    assert seed["paper"] == {"Skywork-Reward-Llama-3.1-8B": -0.256, "ArmoRM": -0.027}
    p = audit.probes
    assert numbers["probes"]["flagged"] == [a for a, fl in zip(p.axes, p.flagged) if fl]
    assert numbers["probes"]["flag_floor"] == pytest.approx(p.min_effect * p.scale)
    assert [numbers["probes"]["axes"][a]["mean"] for a in p.axes] == pytest.approx(list(p.mean))
    c = audit.concepts
    assert [numbers["concepts"]["concepts"][n]["slope"] for n in c.names] == pytest.approx(list(c.slope))
    split = numbers["features"]["margin_split"]  # the SAE split is exact: its parts add up to the margin
    assert split["total"] == pytest.approx(margin.mean(), abs=1e-4)
    assert sum(v for k, v in split.items() if k != "total") == pytest.approx(split["total"], abs=1e-5)
    top = audit.features.top(10, by="margin")
    got = numbers["features"]["top_margin"]
    assert [t["feature"] for t in got] == [i for i, _ in top]
    assert [t["margin"] for t in got] == pytest.approx([v for _, v in top])


def test_subset_numbers_equal_a_naive_loop(audit, numbers):
    got = numbers["subsets"]
    names = sorted({s for s in SUBSETS if s is not None}) + ["(no subset)"]
    assert got["names"] == names
    r = audit.lens.reward.astype(np.float64)
    f = audit.faithfulness
    top = np.argsort(-np.abs(f.total).mean(0), kind="stable")[:10]  # mean |effect|, the one ranking rule
    assert got["top_parts"]["parts"] == [f.names[i] for i in top]
    for name in names:
        rows = [i for i, s in enumerate(SUBSETS) if (s or "(no subset)") == name]
        wins = sum(r[2 * i] > r[2 * i + 1] for i in rows)
        acc = got["accuracy"][name]
        assert (acc["n"], acc["correct"]) == (len(rows), wins)
        assert [acc["lo"], acc["hi"]] == pytest.approx(list(wilson(wins, len(rows))))
        for kind in ("linear", "normed"):
            depth = [audit.lens.crystallization(kind, audit.fraction)[i] for i in rows]
            c = got["crystallization"][name][kind]
            assert [c["q25"], c["median"], c["q75"]] == pytest.approx(list(np.quantile(depth, [0.25, 0.5, 0.75])))
        effects = [[f.total[i, j] for i in rows] for j in top]
        assert got["top_parts"]["mean_total_effect"][name] == pytest.approx([np.mean(e) for e in effects])
        seed = [f.seed_rho[i] for i in rows if np.isfinite(f.seed_rho[i])]
        assert got["seed_statistic"][name]["rho"] == pytest.approx(np.mean(seed))
        assert got["seed_statistic"][name]["pairs"] == len(seed)


def test_instrument_numbers_equal_the_results_own(audit, numbers):
    f, d = audit.faithfulness, audit.divergence
    for row in numbers["estimands"]:
        j = f.names.index(row["part"])
        assert row["direct"] + row["indirect"] == pytest.approx(row["total"], abs=1e-6)
        assert row["total"] == pytest.approx(f.total[:, j].mean())
        assert row["direct"] == pytest.approx(f.direct[:, j].mean())
    div = numbers["divergence"]
    assert div["flagged_share"] == pytest.approx(np.mean(d.divergence > 1))
    assert "max_abs_difference_from_total" not in div  # one sweep: nothing to reconcile
    for row in div["parts"]:
        j = d.names.index(row["part"])
        assert row["flagged_runs"] == int((d.divergence[:, j] > 1).sum())
        inside = f.total[d.divergence[:, j] <= 1, f.names.index(row["part"])]  # the audit's effects, d's flags
        assert row["mean_effect_in_distribution"] == (pytest.approx(inside.mean()) if len(inside) else None)
        assert row["mean_effect"] == pytest.approx(f.total[:, f.names.index(row["part"])].mean())
    dist = numbers["distortion"]
    for k, q in enumerate(audit.distortion.quality):
        assert dist["quality"][q]["note"] == audit.distortion.note[k]
        for i, a in enumerate(audit.distortion.axes):
            want = audit.distortion.index[i, k]
            assert dist["axes"][a][q]["index"] == (None if np.isnan(want) else pytest.approx(want))
    assert numbers["cascades"]["clusters"] == [list(c) for c in audit.cascades.clusters]
    assert numbers["tokens"]["closure_error"] < 1e-4
    assert len(numbers["tokens"]["shown"]) == len(PAIRS)


def test_the_papers_statistic_is_reported_beside_ours_when_present(audit):
    from rewardlens.audit.report import summary

    f = audit.faithfulness
    assert summary(audit)["faithfulness"]["paper_statistic"] is None
    # Given the same arrays as the seed statistic, the paper's way must give the same numbers, and the
    # estimand rows must stay what they were (the extra summary row is not mistaken for one).
    same = replace(audit, faithfulness=replace(f, paper_attribution=f.seed_attribution, paper_effect=f.seed_effect))
    got = summary(same)["faithfulness"]
    assert [got["paper_statistic"][k] for k in ("rho", "lo", "hi")] == pytest.approx(list(f.seed_statistic()))
    assert got["pooled"] == summary(audit)["faithfulness"]["pooled"]


def test_json_has_null_for_nan():
    got = plain({"a": float("nan"), "b": np.float32(np.inf), "c": np.array([1.0, np.nan]), "d": (np.int64(3), True)})
    assert got == {"a": None, "b": None, "c": [1.0, None], "d": [3, True]}


def test_parquet_round_trips(audit, report, numbers):
    out, frames = report.parent, tables(audit)
    own = {"lens": audit.lens.to_frame(), "sublayers": audit.sublayers.to_frame(), "heads": audit.heads.to_frame(),
           "faithfulness": audit.faithfulness.to_frame(), "probes": audit.probes.to_frame(),
           "concepts": audit.concepts.to_frame(), "concept_dose": audit.concepts.dose_frame(),
           "features": audit.features.to_frame(), "divergence": audit.divergence.to_frame(),
           "distortion": audit.distortion.to_frame(), "cascades": audit.cascades.to_frame(),
           "tokens": audit.tokens.to_frame()}
    for name, meta in numbers["tables"].items():
        back = pd.read_parquet(out / meta["file"])
        pd.testing.assert_frame_equal(back, frames[name])
        assert meta["rows"] == len(back) and meta["columns"] == list(back.columns)
        if name in own:  # the tokens table also names each row's audit pair
            pd.testing.assert_frame_equal(back.drop(columns="pair") if name == "tokens" else back, own[name])
    assert list(frames["tokens"]["pair"].unique()) == [audit.pair_ids[i] for i in audit.token_pairs]
    scores = pd.read_parquet(out / "scores.parquet")
    assert list(scores["pair"]) == audit.pair_ids
    r = audit.lens.reward
    np.testing.assert_allclose(scores["margin"], r[0::2] - r[1::2])


def test_html_has_every_section_and_figure(report):
    text = report.read_text(encoding="utf-8")
    page = Page(text)
    assert list(page.sections) == list(SECTIONS)
    assert set(page.figures) == {f"fig-{f}" for f in FIGURES}
    assert {f["data-figure"] for f in page.figures.values()} == FIGURES
    assert len(page.images) == len(FIGURES)
    # the demo model's head has one output, read at one token; the circuit runs only with --circuit, the graphs
    # only with --graph
    assert page.notrun == {"conflicts", "steps", "circuit", "graphs"}
    # Every instrument's section says in plain words what it measures and how to read it.
    assert page.how == set(SECTIONS) - {"summary", "conflicts", "steps", "circuit", "graphs"}
    for img in page.images:
        assert img["src"].startswith("data:image/png;base64,")
        png = base64.b64decode(img["src"].split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # Self-contained: no external URL, no external script or stylesheet.
    assert re.search(r"https?://|//cdn|<link\b", text) is None
    assert all("src" not in s for s in page.scripts) and len(page.scripts) == 1
    assert len(text) < 2_000_000


def test_text_is_escaped(audit, report):
    text = report.read_text(encoding="utf-8")
    assert EVIL not in text and "alert(" in text
    assert html.escape(EVIL) in text
    assert html.escape(audit.model) in text and "fp&lt;1&gt;" in text and "sum&amp;2" in text
    page = Page(text)
    assert len(page.scripts) == 1  # the page's own: neither the pair id nor the response became a script
    assert len(page.images) == len(FIGURES)  # the response's <img onerror=...> is text, not an element
    assert len(page.tokens) == 2 * len(PAIRS)  # every pair shown (under the cap), both sides
    assert sum(SCRIPT in t for t in page.tokens) == 1  # pair 2's chosen side reads as the response's own text


def test_missing_instruments_say_not_run(audit, tmp_path):
    bare = replace(audit, probes=None, concepts=None, features=None, tokens=None, divergence=None, distortion=None,
                   cascades=None, subsets=[])
    path = write_report(bare, tmp_path)
    page = Page(path.read_text(encoding="utf-8"))
    assert list(page.sections) == list(SECTIONS)
    assert page.notrun == {"probes", "concepts", "features", "tokens", "divergence", "distortion", "cascades",
                           "conflicts", "subsets", "steps", "circuit", "graphs"}
    assert "carry no subset" in page.text["subsets"]
    assert set(page.figures) == {"fig-lens", "fig-scatter", "fig-heatmap", "fig-crystallization", "fig-estimands"}
    text = path.read_text(encoding="utf-8")
    for how in ("rewardlens.probe(model)", "rewardlens.concepts(model)", "--sae"):
        assert how in text
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    assert numbers["probes"] is None and numbers["concepts"] is None and numbers["features"] is None
    assert all(numbers[k] is None for k in ("tokens", "divergence", "distortion", "cascades", "conflicts", "subsets"))
    assert not {"probes", "concepts", "features", "tokens", "divergence", "subsets"} & set(numbers["tables"])
    assert not (tmp_path / "probes.parquet").exists()


def test_mismatched_pairs_are_refused(audit, tmp_path):
    with pytest.raises(RewardLensError, match="pairs"):
        write_report(replace(audit, pair_ids=audit.pair_ids[:-1]), tmp_path)


def test_figures_plot_the_results(audit):
    fig = figures.fig_lens(audit)
    for ax, kind in zip(fig.axes, ("linear", "normed")):
        bold = [line for line in ax.get_lines() if line.get_label() == f"{kind} lens, mean over pairs"]
        np.testing.assert_allclose(bold[0].get_ydata(), audit.lens.margin(kind).mean(0))
    rows, cols, grid = figures.part_grid(audit.heads.names, audit.heads.margin.mean(0))
    mean = dict(zip(audit.heads.names, audit.heads.margin.mean(0)))
    assert grid[rows.index("L1"), cols.index("H2")] == pytest.approx(mean["attn_L1_H2"])
    assert grid[rows.index("L0"), cols.index("MLP · embed")] == pytest.approx(mean["mlp_L0"])
    assert grid[rows.index("embed"), cols.index("MLP · embed")] == pytest.approx(mean["embed"])
    assert np.isfinite(grid).sum() == len(audit.heads.names)
    with pytest.raises(RewardLensError, match="probes"):
        figures.fig_probes(replace(audit, probes=None))
    with pytest.raises(RewardLensError, match="conflicts"):
        figures.fig_conflicts(audit)


def test_shared_figures_are_the_results_own_plots(audit):
    """Where the report shows what a result draws, it is that result's `plot(ax=...)` on the report's own
    (constrained-layout, pyplot-free) figure: the same numbers, and no pyplot figure opened."""
    import matplotlib.pyplot as plt

    open_before = plt.get_fignums()
    fig = figures.fig_scatter(audit)
    for ax, name in zip(fig.axes, ("direct", "total")):
        xy = ax.collections[0].get_offsets()
        np.testing.assert_allclose(xy[:, 0], audit.faithfulness.attribution.ravel())
        np.testing.assert_allclose(xy[:, 1], getattr(audit.faithfulness, name).ravel())
    ax = figures.fig_probes(audit).axes[0]
    np.testing.assert_allclose(ax.collections[-1].get_offsets()[:, 0], audit.probes.mean)
    bars = figures.fig_features(audit).axes[0].patches
    np.testing.assert_allclose([b.get_width() for b in bars][::-1], [v for _, v in audit.features.top(20, by="margin")])
    fig = figures.fig_cascades(audit)
    np.testing.assert_allclose(np.ma.filled(fig.axes[0].images[0].get_array(), np.nan), audit.cascades.rho,
                               equal_nan=True)
    assert fig.get_layout_engine().__class__.__name__ == "ConstrainedLayoutEngine"
    assert plt.get_fignums() == open_before


def test_depth_histogram_and_estimand_bars_plot_the_results(audit, numbers):
    fig = figures.fig_crystallization(audit)
    n_layers = audit.lens.n_layers
    for ax, kind in zip(fig.axes, ("linear", "normed")):
        depth = audit.lens.crystallization(kind, audit.fraction)
        assert len(ax.containers) == len(numbers["subsets"]["names"])  # one stacked layer per subset
        heights = np.sum([[bar.get_height() for bar in c] for c in ax.containers], axis=0)
        want = np.bincount(np.rint(depth[np.isfinite(depth)] * n_layers).astype(int), minlength=n_layers + 1)
        np.testing.assert_array_equal(heights, want)
        # a depth is l/L in [0, 1]: no bar and no axis reaches past either end
        left = [bar.get_x() for c in ax.containers for bar in c]
        right = [bar.get_x() + bar.get_width() for c in ax.containers for bar in c]
        assert min(left) >= 0.0 and max(right) <= 1.0 + 1e-12 and ax.get_xlim() == (0.0, 1.0)
    fig = figures.fig_estimands(audit)
    direct, indirect, total = ([bar.get_width() for bar in c] for c in fig.axes[0].containers)
    rows = numbers["estimands"]
    np.testing.assert_allclose(direct, [r["direct"] for r in rows], rtol=1e-6)
    np.testing.assert_allclose(indirect, [r["indirect"] for r in rows], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(total, [r["total"] for r in rows], rtol=1e-6)


# ---- the page in a real browser --------------------------------------------------------------------

def _chromium(args: list[str], page: Path | str, profile: Path) -> subprocess.CompletedProcess:
    return chromium(args, page, profile, what="the report")


def test_chromium_renders_every_section_and_figure(report, tmp_path):
    width = 1280
    dom = Page(_chromium([f"--window-size={width},900", "--dump-dom"], report, tmp_path / "profile-dom").stdout)
    assert list(dom.sections) == list(SECTIONS)
    assert set(dom.figures) == {f"fig-{f}" for f in FIGURES}
    assert len(dom.images) == len(FIGURES)
    undecoded = [i.get("alt") for i in dom.images if i.get("data-decoded") != "1"]
    assert not undecoded, f"images the browser did not decode: {undecoded}"
    assert dom.body["data-images-decoded"] == dom.body["data-images-total"] == str(len(FIGURES))
    for name in NEW_SECTIONS:  # each new section rendered with its explanation and its content
        assert name in dom.how and len(dom.text[name]) > 300, name
    assert len(dom.tokens) == 2 * len(PAIRS)
    assert sum(SCRIPT in t for t in dom.tokens) == 1  # the response's script shows as text ...
    assert len(dom.scripts) == 1 and "data-pwned" not in dom.body  # ... and neither it nor its <img> ran

    artifacts = Path(os.environ.get("REWARDLENS_ARTIFACTS", REPO / "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "report.png"
    shot.unlink(missing_ok=True)
    height = min(int(dom.body["data-page-height"]), 16000)
    _chromium([f"--window-size={width},{height}", f"--screenshot={shot}"], report, tmp_path / "profile-shot")
    shutil.copy(report, artifacts / "report.html")

    from PIL import Image

    image = Image.open(io.BytesIO(shot.read_bytes()))
    image.load()
    assert image.size == (width, height) and height > 2000
    gray = np.asarray(image.convert("L"), dtype=np.float64)
    assert gray.std() > 10, "the screenshot is (nearly) blank"
    colors = len(np.unique(np.asarray(image.convert("RGB")).reshape(-1, 3), axis=0))
    assert colors > 200, f"the screenshot has only {colors} colours: figures did not render"


def test_numbers_json_holds_exactly_the_summary_schema(audit, numbers):
    """`summary`, numbers.json, the page and the CLI share one schema (`AuditSummary`): every key it
    declares is there and nothing undeclared is, down to the typed sections."""
    from rewardlens.audit.report import AuditSummary, summary
    from rewardlens.audit.report._schema import FaithfulnessSummary, LensSummary, PairScore, Scores, TopPart

    got = summary(audit)
    assert set(got) == set(AuditSummary.__annotations__)
    assert set(numbers) == set(AuditSummary.__annotations__) | {"tables"}
    for key, schema in (("scores", Scores), ("lens", LensSummary), ("faithfulness", FaithfulnessSummary)):
        assert set(got[key]) == set(schema.__annotations__), key
    assert got["pairs"] and all(set(p) == set(PairScore.__annotations__) for p in got["pairs"])
    assert got["top_parts"] and all(set(t) == set(TopPart.__annotations__) for t in got["top_parts"])
    assert [p["id"] for p in got["pairs"]] == audit.pair_ids
