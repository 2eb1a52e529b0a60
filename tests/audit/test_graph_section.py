"""The audit's attribution graphs (`Plan(graph=True)`, `rewardlens audit --graph`): the margin graphs of the first
pairs the report shows, computed once as a whole-model result, stored, read back on a rerun without computing
them again, summarised, and shown on the page with a link to each pair's interactive page.

The yardstick is `rl.graph` run directly on the same pair in the test (exact neurons on the tiny Llama)."""

from __future__ import annotations

import json
import re

import pytest

import rewardlens as rl
from rewardlens.audit import Plan, Store, audit
from rewardlens.audit import _graph as graph_job
from rewardlens.audit._graph import GRAPH_MAX_NODES, GRAPH_PAIRS, GRAPH_PATHS, graph_name
from rewardlens.audit._whole import shown_pairs, whole_key
from rewardlens.audit.report import margins, summary, write_report
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import RewardLensWarning, UsageError
from tests.graphs.conftest import random_transcoders

WITH_GRAPH = Plan(graph=True, probes=False, concepts=False, divergence=False, tokens=False)
FLAGS = ["--no-probes", "--no-concepts", "--no-divergence", "--no-tokens", "--quiet"]


@pytest.fixture(scope="module")
def counted(monkeypatch_module):
    """Every call of `graph` the audit's job makes, counted."""
    calls = []
    real = graph_job.graph

    def counting(*args, **kwargs):
        calls.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch_module.setattr(graph_job, "graph", counting)
    return calls


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def run(llama, data, counted, tmp_path_factory):
    path = tmp_path_factory.mktemp("graph-store") / "results.sqlite"
    res = audit(llama, data, store=path, plan=WITH_GRAPH)
    return path, res


@pytest.fixture(scope="module")
def direct(llama, data, run):
    """The yardstick: `rl.graph` of each graphed pair alone, exact neurons, the graphs' own defaults."""
    _, res = run
    chosen = shown_pairs(margins(res)[2])[:GRAPH_PAIRS]
    return chosen, [rl.graph(llama, data[i], basis="neurons", max_nodes=GRAPH_MAX_NODES)[0] for i in chosen]


def test_the_graphed_pairs_are_the_first_shown_and_their_numbers_are_the_graphs(run, direct):
    _, res = run
    chosen, graphs = direct
    assert res.graphs is not None and res.graphs.basis == "neurons"
    assert res.graphs.pairs == chosen and len(chosen) == min(GRAPH_PAIRS, len(res.pair_ids))
    for k, (row, pg) in enumerate(zip(res.graphs.rows, graphs)):
        g = pg.margin
        nodes, edges = g.to_frame()
        pruned = g.prune()
        assert row["margin"] == pytest.approx(g.reward, abs=1e-6)
        assert row["chosen"] == pytest.approx(pg.chosen.reward, abs=1e-6)
        assert row["replacement"] == pytest.approx(g.scores.replacement, abs=1e-6)
        assert row["completeness"] == pytest.approx(g.scores.completeness, abs=1e-6)
        assert row["closure_gap"] == pytest.approx(g.closure_gap, rel=1e-6, abs=1e-12)
        assert row["dropped"] == g.dropped
        assert (row["nodes"], row["edges"]) == (len(nodes), len(edges))
        assert row["features"] == int((nodes["kind"] == "feature").sum())
        assert row["pruned_nodes"] == len(pruned.nodes.names)
        stored = res.graphs.page_graph(k)  # what the pair's page shows
        assert stored.nodes.names == pruned.nodes.names and (stored.rows == pruned.rows).all()
        assert stored.adjacency == pytest.approx(pruned.adjacency, abs=1e-6)
        want = pruned.top_paths(GRAPH_PATHS)
        assert [p["path"] for p in row["paths"]] == [p for p, _ in want]
        assert [p["weight"] for p in row["paths"]] == pytest.approx([w for _, w in want], abs=1e-6)
        top = nodes[nodes["kind"] == "feature"].sort_values("influence", ascending=False, kind="stable")
        assert [f["node"] for f in row["top_features"]] == list(top["node"][:len(row["top_features"])])


def test_a_second_run_reads_the_stored_graphs_back(llama, data, run, counted):
    path, res = run
    assert counted == [len(res.graphs.pairs)]  # one call, over the graphed pairs
    store = Store(path)
    try:
        assert len(store.records(whole_key(llama, data, graph_name(None)))) == 1
    finally:
        store.close()
    again = audit(llama, data, store=path, plan=WITH_GRAPH)
    assert counted == [len(res.graphs.pairs)]  # nothing computed again
    assert again.graphs.rows == res.graphs.rows and again.graphs.pairs == res.graphs.pairs


def test_the_page_states_each_graph_and_links_its_page(run, direct, tmp_path):
    _, res = run
    page = write_report(res, tmp_path).read_text(encoding="utf-8")
    section = page[page.index('<section id="graphs">'):]
    section = section[:section.index("</section>")]
    assert 'class="notrun"' not in section
    for i, pg in zip(*direct):
        g = pg.margin
        assert f"{g.scores.replacement:.3f}" in section and f"{g.scores.completeness:.3f}" in section
        assert f"{len(g.to_frame()[0])} nodes" in section
        href = f"graphs/pair_{i}.html"
        assert f'href="{href}"' in section
        written = (tmp_path / href).read_text(encoding="utf-8")
        assert "graph-data" in written and g.prune().top_paths(1)[0][0][0] in written
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    assert [p["pair"] for p in numbers["graphs"]["pairs"]] == direct[0]
    assert numbers["tables"]["graphs"]["rows"] == len(direct[0])
    # the page holds no link that leaves the folder, and stays one valid page without the graph pages
    assert not re.search(r'href="(?!#|graphs/pair_\d+\.html)', page)


def test_without_the_flag_the_section_names_it_and_old_pages_go(llama, data, run, tmp_path):
    write_report(run[1], tmp_path)  # an earlier run with --graph into the same folder
    assert len(list((tmp_path / "graphs").glob("pair_*.html"))) == len(run[1].graphs.pairs)
    (tmp_path / "graphs" / "notes.txt").write_text("mine")  # a file rewardlens did not write stays
    res = audit(llama, data, store=Store(":memory:"),
                plan=Plan(probes=False, concepts=False, divergence=False, tokens=False))
    assert res.graphs is None and summary(res)["graphs"] is None
    with pytest.warns(RewardLensWarning, match="graphs.parquet"):  # the earlier run's table goes too
        page = write_report(res, tmp_path).read_text(encoding="utf-8")
    section = page[page.index('<section id="graphs">'):]
    assert 'class="notrun"' in section[:section.index("</section>")] and "<code>--graph</code>" in section
    assert [f.name for f in (tmp_path / "graphs").iterdir()] == ["notes.txt"]


def test_the_command_line_flag_graphs_with_neurons(tiny_root, data, direct, tmp_path, capsys):
    pairs = str(save_pairs(data, tmp_path / "pairs.jsonl"))
    out = tmp_path / "out"
    assert main(["audit", str(tiny_root["llama"]), "--pairs", pairs, "--out", str(out), "--graph", *FLAGS,
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["graphs"]
    assert got["basis"] == "neurons" and [p["pair"] for p in got["pairs"]] == direct[0]
    for row, pg in zip(got["pairs"], direct[1]):
        assert row["replacement"] == pytest.approx(pg.margin.scores.replacement, abs=1e-6)
        assert (out / f"graphs/pair_{row['pair']}.html").is_file()


def test_transcoders_that_do_not_fit_exit_2_in_one_line(llama, tiny_root, data, tmp_path, capsys):
    class Wider:
        d_model = llama.d_model * 2
        n_layers = llama.n_layers

    folder = random_transcoders(Wider()).save(tmp_path / "tc")
    pairs = str(save_pairs(data, tmp_path / "pairs.jsonl"))
    code = main(["audit", str(tiny_root["llama"]), "--pairs", pairs, "--out", str(tmp_path / "out"), "--graph",
                 "--transcoders", str(folder), *FLAGS])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "wide" in err, err
    assert not (tmp_path / "out" / "results.sqlite").exists()  # refused before anything was computed
    assert main(["audit", str(tiny_root["llama"]), "--pairs", pairs, "--out", str(tmp_path / "o2"),
                 "--transcoders", str(folder), *FLAGS]) == 2  # transcoders without --graph
    assert "--graph" in capsys.readouterr().err


def test_no_transcoders_on_a_model_past_the_neuron_limit_names_the_flag(llama, data, monkeypatch):
    monkeypatch.setattr(graph_job, "NEURON_LIMIT", graph_job.mlp_neurons(llama) - 1)
    with pytest.raises(UsageError) as exc:
        audit(llama, data, store=Store(":memory:"), plan=WITH_GRAPH)
    assert "--transcoders" in str(exc.value) and "\n" not in str(exc.value)


def test_a_pair_that_cannot_be_graphed_leaves_the_graphs_out_with_a_warning(llama, data, monkeypatch):
    def refuse(model, pairs, *args, **kwargs):
        raise UsageError(f"pair of {len(pairs)} refused (a stand-in for a pair past the length limit)")

    monkeypatch.setattr(graph_job, "graph", refuse)
    store = Store(":memory:")
    with pytest.warns(RewardLensWarning, match="attribution graphs are left out: pair of"):
        res = audit(llama, data, store=store, plan=WITH_GRAPH)
    assert res.graphs is None and not store.records(whole_key(llama, data, graph_name(None)))  # a rerun tries again


def test_transcoders_that_fit_are_graphed_and_named_in_the_store(llama, data):
    tcs = random_transcoders(llama)
    store = Store(":memory:")
    res = audit(llama, data[:2], store=store, plan=WITH_GRAPH, transcoders=tcs)
    assert res.graphs.basis == "transcoders" and res.graphs.fidelity
    assert graph_name(tcs) != graph_name(random_transcoders(llama, seed=1)) != graph_name(None)
    want = rl.graph(llama, data[res.graphs.pairs[0]], tcs, max_nodes=GRAPH_MAX_NODES)[0].margin
    assert res.graphs.rows[0]["replacement"] == pytest.approx(want.scores.replacement, abs=1e-6)
