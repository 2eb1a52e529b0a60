"""The audit's circuit section (`Plan(circuit=True)`, `rewardlens audit --circuit`): computed once as a
whole-model result, stored, read back by `collect`, summarised, and shown on the page; off by default."""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Plan, Store, audit
from rewardlens.audit._whole import CIRCUIT, CIRCUIT_TOP, whole_key
from rewardlens.audit.internal import collect
from rewardlens.audit.report import summary, write_report
from rewardlens.cli import main
from rewardlens.data import save_pairs

QUICK = Plan(probes=False, concepts=False, divergence=False, tokens=False)
WITH_CIRCUIT = Plan(circuit=True, probes=False, concepts=False, divergence=False, tokens=False)


@pytest.fixture(scope="module")
def run(llama, data):
    store = Store(":memory:")
    return store, audit(llama, data, store=store, plan=WITH_CIRCUIT)


@pytest.fixture(scope="module")
def direct(llama, data):
    """The yardstick: `rl.circuit` run directly on the same pairs with the audit's settings."""
    return rl.circuit(llama, data, top=CIRCUIT_TOP, method="eap-ig", batch_size=WITH_CIRCUIT.batch_size)


def _same(a: rl.Circuit, b: rl.Circuit) -> None:
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        else:
            assert x == y, f.name


def test_the_circuit_is_stored_and_read_back_equal(llama, data, run):
    store, res = run
    assert res.circuit is not None and res.circuit.level == "sublayer" and res.circuit.method == "eap-ig"
    assert len(store.records(whole_key(llama, data, CIRCUIT))) == 1
    _same(collect(llama, data, store, WITH_CIRCUIT).circuit, res.circuit)


def test_the_summary_numbers_equal_circuit_run_directly(run, direct):
    got = summary(run[1])["circuit"]
    want = direct.to_dict()
    assert got is not None and len(got["kept"]) == CIRCUIT_TOP == 10
    assert [(k["upstream"], k["downstream"]) for k in got["kept"]] == [(u, d) for u, d, _ in direct.kept]
    np.testing.assert_allclose([k["score"] for k in got["kept"]], [s for *_, s in direct.kept], atol=1e-6)
    assert [p["edges"] for p in got["curve"]] == direct.sizes
    np.testing.assert_allclose([p["share"] for p in got["curve"]], direct.shares, atol=1e-6)
    for key in ("share", "clean_margin", "empty_margin"):
        assert got[key] == pytest.approx(want[key], abs=1e-6), key


def test_the_page_shows_the_circuit_section(run, direct, tmp_path):
    page = write_report(run[1], tmp_path).read_text(encoding="utf-8")
    section = page[page.index('<section id="circuit">'):]
    section = section[:section.index("</section>")]
    assert 'id="fig-circuit"' in section and 'class="notrun"' not in section
    assert f"{direct.share:.3g}" in section and direct.kept[0][0] in section
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    assert numbers["circuit"]["share"] == pytest.approx(direct.share, abs=1e-6)
    # the result's own frame: edges, margin, share (of each pair's own margin), share of the mean margin
    assert numbers["tables"]["circuit"]["columns"] == ["edges", "margin", "share", "share_of_mean_margin"]


def test_without_the_flag_the_section_names_it(llama, data, tmp_path):
    res = audit(llama, data, store=Store(":memory:"), plan=QUICK)
    assert res.circuit is None and summary(res)["circuit"] is None
    page = write_report(res, tmp_path).read_text(encoding="utf-8")
    section = page[page.index('<section id="circuit">'):]
    section = section[:section.index("</section>")]
    assert 'class="notrun"' in section and "<code>--circuit</code>" in section and "fig-circuit" not in page


def test_the_command_line_flag_runs_the_circuit(tiny_root, data, direct, tmp_path, capsys):
    pairs = str(save_pairs(data, tmp_path / "pairs.jsonl"))
    assert main(["audit", str(tiny_root["llama"]), "--pairs", pairs, "--out", str(tmp_path / "out"), "--circuit",
                 "--no-probes", "--no-concepts", "--no-divergence", "--no-tokens", "--quiet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["circuit"]["share"] == pytest.approx(direct.share, abs=1e-6)
