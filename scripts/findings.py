"""Regenerate the numbers and figures of docs/findings.md for one real reward model.

    python scripts/findings.py smollm2-dpo            # the 60 held-out dpo_en_demo pairs
    python scripts/findings.py minilm-dpo
    python scripts/findings.py smollm2-dpo --limit 2 --shortest --probe-items 3 --out /tmp/f   # CI's reduced run

It runs the full audit (`rewardlens.audit._runner`: lens, attribution, read-position patching, the
faithfulness report, probes, concepts) on the model that `rewardlens.zoo.realmodels` builds offline,
adds neuron-level attribution for the top neurons, and writes into `--out` (default
docs/findings/<model>/): `findings.json` (every number the doc quotes), `tables.md` (the doc's
tables, rendered from that JSON), four figures, and the audit's own report.html, numbers.json,
Parquet tables and results store (resumable: rerunning reuses finished pairs). `--doc FILE`
also rewrites the block of FILE between `<!-- findings:<model> -->` and `<!-- /findings:<model> -->`
with `tables.md`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SEED_PAPER = {"depth": 0.90, "rho": {"Skywork-Reward-Llama-3.1-8B": -0.256, "ArmoRM": -0.027},
              "skywork_penalises": ["length", "confidence", "formatting"]}
"""The seed paper's findings on Skywork-Reward-Llama-3.1-8B and ArmoRM, for comparison."""


def _median_iqr(x: np.ndarray) -> list[float | None]:
    x = x[np.isfinite(x)]
    return [float(v) for v in np.percentile(x, [25, 50, 75])] if len(x) else [None, None, None]


def shortest(model: object, pairs: list, n: int) -> list:
    """The `n` pairs whose longer side has the fewest tokens, in their held-out order: CI's reduced run, whose
    prefix patching (the paper's statistic) costs in proportion to the patched side's length."""
    seqs, _ = model.encode(pairs)  # type: ignore[attr-defined]
    longer = [max(len(seqs[2 * i].ids), len(seqs[2 * i + 1].ids)) for i in range(len(pairs))]
    keep = sorted(sorted(range(len(pairs)), key=lambda i: (longer[i], i))[:n])
    return [pairs[i] for i in keep]


def findings(name: str, limit: int | None, out: Path, progress: bool, probe_items: int | None = None,
             short: bool = False) -> dict:
    import rewardlens as rl
    from rewardlens.audit import Plan
    from rewardlens.audit.report import plain, summary, write_report
    from rewardlens.zoo import realmodels

    t0 = time.monotonic()
    model = realmodels.load_reward_model(name)
    held_out = realmodels.dpo_pairs("test")
    pairs = shortest(model, held_out, limit) if short and limit else held_out[:limit]
    out.mkdir(parents=True, exist_ok=True)
    # paper=True: the seed paper's statistic its own way too (prefix noising, attention and MLP sublayers)
    plan = Plan(chunk_size=4, batch_size=4, probe_items=probe_items, paper=True)
    audit = rl.audit(model, pairs, store=out / "results.sqlite", plan=plan, progress=progress)
    write_report(audit, out)
    numbers = summary(audit)

    ln, f = audit.lens, audit.faithfulness
    depth = {k: ln.crystallization(k, audit.fraction) for k in ("linear", "normed")}
    grid = np.arange(ln.n_layers + 1) / ln.n_layers
    margin = ln.reward[0::2] - ln.reward[1::2]

    heads = audit.heads  # ranked by |mean margin contribution| (`Attribution.top`), heads only
    head_rows = [{"part": part, "attribution": value,
                  "total": float(f.total.mean(0)[f.names.index(part)]),
                  "direct": float(f.direct.mean(0)[f.names.index(part)])}
                 for part, value in heads.top(len(heads.names), by="margin") if "_H" in part][:10]
    neurons = rl.attribute(model, pairs, level="neuron", batch_size=4)
    # Relative to the mean |margin|: a model near chance has a mean margin near 0, which no share can use.
    neuron_rows = [{"part": part, "attribution": value, "per_mean_abs_margin": float(value / np.abs(margin).mean())}
                   for part, value in neurons.top(len(neurons.names), by="margin") if "_N" in part][:10]

    indirect = np.abs(f.indirect).sum() / max(np.abs(f.total).sum(), 1e-12)
    result = {
        "model": name, "command": f"python scripts/findings.py {name}" + (f" --limit {limit}" if limit else "")
        + (" --shortest" if short and limit else "") + (f" --probe-items {probe_items}" if probe_items else ""),
        "n_pairs": len(pairs), "split": "test", "n_layers": ln.n_layers,
        "training": realmodels.metrics(name),
        "accuracy": numbers["scores"]["accuracy"], "mean_margin": numbers["scores"]["mean_margin"],
        "mean_abs_margin": float(np.abs(margin).mean()),
        "closure_error": numbers["closure_error"]["max"],
        "crystallization": {
            k: {"quartiles": _median_iqr(d), "defined": int(np.isfinite(d).sum()),
                "histogram": [int(np.sum(np.isclose(d, g))) for g in grid]} for k, d in depth.items()},
        "faithfulness": {**numbers["faithfulness"],
                         "indirect_share_of_total_abs": float(indirect)},
        "probes": numbers["probes"], "concepts": numbers["concepts"],
        "top_heads": head_rows, "top_neurons": neuron_rows,
        "neuron_closure_error": float(np.abs(neurons.residual_error).max()),
        "seed_paper": SEED_PAPER, "seconds": round(time.monotonic() - t0, 1),
    }
    _figures(audit, depth, grid, out)
    result = plain(result)
    (out / "findings.json").write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    (out / "tables.md").write_text(tables(result))
    return result


def _figures(audit, depth: dict, grid: np.ndarray, out: Path) -> None:
    from matplotlib.figure import Figure

    from rewardlens.audit.report import figures

    fig = Figure(figsize=(6, 3))
    ax = fig.subplots()
    width = 0.4 / len(grid)
    for k, (kind, d) in enumerate(depth.items()):
        counts = [np.sum(np.isclose(d, g)) for g in grid]
        ax.bar(grid + (k - 0.5) * width, counts, width=width, label=f"{kind} lens")
    ax.set(xlabel="crystallization depth l/L (fraction 0.5)", ylabel="pairs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "depth.png", dpi=100)
    for name, make in (("lens", figures.fig_lens), ("scatter", figures.fig_scatter),
                       ("probes", figures.fig_probes)):
        make(audit).savefig(out / f"{name}.png", dpi=100)


def _num(x, fmt: str = "+.3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _ci(d: dict, key: str = "rho") -> str:
    return f"{_num(d[key])} [{_num(d['lo'])}, {_num(d['hi'])}]"


def tables(r: dict) -> str:
    """The doc's tables for one model, from its findings.json."""
    c = r["crystallization"]
    fa = r["faithfulness"]
    lines = [
        f"*Regenerate: `{r['command']}` ({r['n_pairs']} held-out pairs, {r['n_layers']} layers).*", "",
        (f"- held-out pair accuracy {r['accuracy']:.3f}; mean margin {_num(r['mean_margin'])}; "
        f"largest closure error {r['closure_error']:.1e}"),
        (f"- crystallization depth l/L (median [IQR]): linear {_num(c['linear']['quartiles'][1], '.2f')} "
        f"[{_num(c['linear']['quartiles'][0], '.2f')}, {_num(c['linear']['quartiles'][2], '.2f')}] over "
        f"{c['linear']['defined']} pairs; normed {_num(c['normed']['quartiles'][1], '.2f')} "
        f"[{_num(c['normed']['quartiles'][0], '.2f')}, {_num(c['normed']['quartiles'][2], '.2f')}]"),
        (f"- seed-paper statistic (Spearman |attribution| vs |noising effect|, {fa['seed_statistic']['positions']} "
        f"positions, sublayers): {_ci(fa['seed_statistic'])}"),
        (f"- the same statistic the paper's way (whole-prefix noising aligned from the start over the shorter "
        f"side, attention and MLP sublayers only): {_ci(fa['paper_statistic'])}"),
        (f"- attribution vs direct {_ci(fa['pooled']['direct'])}, vs total {_ci(fa['pooled']['total'])}, "
        f"vs indirect {_ci(fa['pooled']['indirect'])} (mean per-pair Spearman over heads and MLPs); "
        f"indirect share of Σ|total| {fa['indirect_share_of_total_abs']:.2f}"),
        "", "| probe axis | n | mean Δ reward [95% CI] | BH q | flagged |", "|---|---|---|---|---|",
    ]
    if r["probes"]:
        for axis, a in r["probes"]["axes"].items():
            lines.append(f"| {axis} | {a['n']} | {_num(a['mean'])} [{_num(a['ci_low'])}, {_num(a['ci_high'])}] | "
                         f"{_num(a['q'], '.2g')} | {'yes' if a['flagged'] else ''}"
                         f"{' (fragile)' if a.get('fragile') else ''} |")
        pr = r["probes"]  # the scale named as the run stated it (findings.json before issue 42 used the pairs')
        lines.append(f"\nflag floor {pr['flag_floor']:.3f} reward units ({pr['min_effect']:g} × {pr['scale_source']}"
                     + (f"; checked against {pr['alt_scale_source']}: fragile where that changes the flag"
                        if pr.get("alt_scale_source") else "") + ")")
    lines += ["", "| concept | cosine with read-out (last layer) | held-out AUROC | dose slope [95% CI] | R² |",
              "|---|---|---|---|---|"]
    if r["concepts"]:
        for concept, s in r["concepts"]["concepts"].items():
            slope = f"{_num(s['slope'])} [{_num(s['slope_lo'])}, {_num(s['slope_hi'])}]"
            lines.append(f"| {concept} | {_num(s['cosine'])} | {_num(s['auroc_heldout'], '.2f')} | "
                         f"{slope} | {_num(s['r2'], '.2f')} |")
    lines += [f"\nmean |margin| {r['mean_abs_margin']:.3f}", "",
              "| head | attribution | direct | total |", "|---|---|---|---|"]
    lines += [f"| {h['part']} | {_num(h['attribution'])} | {_num(h['direct'])} | {_num(h['total'])} |"
              for h in r["top_heads"][:5]]
    lines += ["", "| neuron | mean margin attribution | ÷ mean \\|margin\\| |", "|---|---|---|"]
    lines += [f"| {n['part']} | {_num(n['attribution'], '+.4f')} | {_num(n['per_mean_abs_margin'], '+.1%')} |"
              for n in r["top_neurons"][:5]]
    return "\n".join(lines) + "\n"


def rewrite_doc(doc: Path, name: str, text: str) -> None:
    """Replace the block between the model's markers in `doc` with `text`."""
    source = doc.read_text()
    start, end = f"<!-- findings:{name} -->", f"<!-- /findings:{name} -->"
    if start not in source or end not in source:
        raise SystemExit(f"{doc} has no '{start}' ... '{end}' block")
    head, rest = source.split(start, 1)
    doc.write_text(f"{head}{start}\n{text}{end}{rest.split(end, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=["smollm2-dpo", "minilm-dpo"])
    parser.add_argument("--limit", type=int, default=None,
                        help="only the first N held-out pairs (CI: 2, with --shortest)")
    parser.add_argument("--out", type=Path, default=None, help="default docs/findings/<model>/")
    parser.add_argument("--shortest", action="store_true",
                        help="with --limit N: the N held-out pairs with the fewest tokens, not the first N")
    parser.add_argument("--probe-items", type=int, default=None,
                        help="probes and concepts on only N built-in items (CI's reduced run: 3)")
    parser.add_argument("--doc", type=Path, default=None, help="rewrite this doc's block for the model")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    out = args.out or REPO / "docs" / "findings" / args.model
    result = findings(args.model, args.limit, out, progress=not args.quiet, probe_items=args.probe_items,
                      short=args.shortest)
    if args.doc:
        rewrite_doc(args.doc, args.model, (out / "tables.md").read_text())
    print(f"{args.model}: accuracy {result['accuracy']:.3f} on {result['n_pairs']} pairs, "
          f"{result['seconds']} s → {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
