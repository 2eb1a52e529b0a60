"""`audit`: every instrument into a resumable store, then an HTML report; shards under torchrun.

Under `torchrun --nproc_per_node N -m rewardlens.cli audit ...` each rank computes its share of
the pair chunks into its own store (`results.rank{r}.sqlite`), rank 0 merges the shards into the
main store once all ranks are done, runs the whole-model instruments and writes the report.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..errors import UsageError
from ..types import SEED_PAPER
from ._common import (
    ArgumentError,
    Command,
    Interrupted,
    add_model_options,
    add_pairs_options,
    add_probe_items_option,
    check_folder,
    check_out_file,
    check_out_folder,
    check_probe_items,
    fraction,
    load_model,
    pairs_file,
    positive,
    quiet_hub,
    read_pairs,
    table,
)

if TYPE_CHECKING:
    from ..audit.report import AuditResult, AuditSummary
    from ..data import Pair
    from ..model import RewardModel
    from ..sae import TopKSAE, Transcoders


def _inputs(args: argparse.Namespace) -> tuple[RewardModel, list[Pair]]:
    if args.model is not None:
        pairs = read_pairs(args)  # a bad pairs file is named before the model loads
        return load_model(args), pairs
    given = pairs_file(args, args.pairs, limit=args.limit) if args.pairs else None
    quiet_hub()
    from ..zoo import AUDIT_PAIRS, DEMO_ORGANISM, demo_model_dir
    from ..zoo.organisms.internal import READY, organism_dir

    quiet = args.json or _rank()[0] != 0
    if not (organism_dir(DEMO_ORGANISM) / READY).exists() and not quiet:
        print("training the demo organism once (about 15 s; cached afterwards) ...", file=sys.stderr)
    args.model = str(demo_model_dir())
    pairs = given if given is not None else AUDIT_PAIRS[: args.limit]
    if not quiet:
        print(f"auditing the built-in demo model: the {DEMO_ORGANISM!r} model organism, a tiny Llama reward model "
              "trained\non synthetic pairs whose chosen answer always agrees with the user's stated view.")
        if not args.pairs:
            print("In the built-in pairs the user states a mistaken view; chosen corrects it, rejected agrees.\n"
                  "A sycophantic model prefers the rejected side: expect negative margins and low accuracy.")
        print()
    return load_model(args), pairs


DEMO_DATA = ("the built-in audit pairs (rewardlens.zoo.AUDIT_PAIRS: each user states a mistaken view; chosen "
             "corrects it, rejected agrees)")
"""What the demo's pairs are, as its report's provenance says (the demo organism prefers the agreeing side)."""


def _rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) outside it."""
    env = os.environ
    try:
        return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))
    except ValueError:  # set by hand, not by torchrun: bad input, not a bug
        shown = {k: env.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        raise ArgumentError(f"torchrun's environment must hold integers, got {shown}; unset them outside "
                            "torchrun") from None


def _distributed(args: argparse.Namespace) -> tuple[int, int]:
    rank, world, local = _rank()
    if world == 1:
        return 0, 1
    import torch
    import torch.distributed as dist

    if args.device is None and torch.cuda.is_available():
        args.device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return rank, world


def _audit(args: argparse.Namespace) -> dict[str, Any]:
    """The audit; on Ctrl-C, one line saying what the store keeps and the command that resumes."""
    state: dict[str, Any] = {}
    try:
        return _run(args, state)
    except KeyboardInterrupt:
        raise Interrupted(_kept(args, state)) from None


def _run(args: argparse.Namespace, state: dict[str, Any]) -> dict[str, Any]:
    """Parse into a plan, call the audit workflow, write the report; every number comes from `summary`."""
    rank, world = _distributed(args)
    out = Path(args.out)
    main_path = Path(args.store) if args.store else out / "results.sqlite"
    model, pairs = _inputs(args)  # a bad pairs file is refused before anything heavy is imported
    if not pairs:
        raise UsageError("no pairs to audit")
    sae = _sae(args, model)  # an SAE that does not fit the model is refused before any pair is computed
    transcoders = _transcoders(args, model)  # so are transcoders (and --graph without them on a large model)
    from ..audit import Decided, Plan, audit, resume_status
    from ..audit.report import AuditResult, plain, summary, write_report

    plan = Plan(chunk_size=args.chunk_size, batch_size=args.batch_size, probes=not args.no_probes,
                concepts=not args.no_concepts, probe_items=args.probe_items, sae_layer=args.sae_layer,
                fraction=args.fraction, divergence=not args.no_divergence, paper=args.paper_statistic,
                tokens=not args.no_tokens, circuit=args.circuit, graph=args.graph)
    decided = Decided.of(model, pairs)  # once: the resume count, the run and an interrupt's message share it
    state.update(model=model, pairs=pairs, plan=plan, store=main_path, rank=rank, world=world, decided=decided)
    before = resume_status(main_path, model, pairs, plan, decided).kept if world == 1 else None
    try:
        result = audit(model, pairs, store=main_path, plan=plan, sae=sae, progress=not args.quiet,
                       data=args.pairs or DEMO_DATA,
                       command_line=args.command_line, rank=rank, world_size=world, hold=[out], decided=decided,
                       transcoders=transcoders)
    finally:
        if world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
    if result is None:  # ranks other than 0: rank 0 reports for all
        return {"rank": rank}
    numbers = summary(result, top=args.top)
    report = write_report(result, out, numbers)
    printed = AuditResult(**numbers, report=str(report), store=str(main_path), pairs_from_store=before)
    return cast(dict[str, Any], plain(printed))


def _kept(args: argparse.Namespace, state: dict[str, Any]) -> str:
    """What the store keeps of this run after an interrupt (`resume_status`), and the command that resumes it."""
    if "model" not in state:
        return f"rewardlens: interrupted before this run stored anything; start it again with: {args.command_line}"
    from ..audit import resume_status
    from ..audit.internal import shard_path

    path = state["store"] if state["world"] == 1 else shard_path(state["store"], state["rank"])
    return resume_status(path, state["model"], state["pairs"], state["plan"], state["decided"]).message(
        args.command_line)


def _sae(args: argparse.Namespace, model: RewardModel) -> TopKSAE | None:
    """The SAE of `--sae`, found and checked as `sae attribute` and `sae report` do (`load_sae_for`: the
    folder or its hook-point subfolder for `--sae-layer`; its width, layer, hook kind and base model)."""
    if args.sae is None:
        return None
    from ..sae import load_sae_for

    sae, _ = load_sae_for(model, args.sae, args.sae_layer, trust_base_model=args.sae_any_model)
    return sae.to(model.device)


def _transcoders(args: argparse.Namespace, model: RewardModel) -> Transcoders | None:
    """The transcoders of `--transcoders`, loaded and checked against the model (`check_graph`: width, layers,
    base model), or None; with `--graph` and none given, the model must be small enough for its own neurons."""
    from ..audit.internal import check_graph

    tcs = None
    if args.transcoders is not None:
        from ..sae import load_transcoders

        tcs = load_transcoders(args.transcoders).to(model.device)
    check_graph(model, args.graph, tcs)
    return tcs


def _show(shown: dict[str, Any]) -> None:
    if "rank" in shown:  # ranks other than 0 print nothing: rank 0 reports for all
        return
    result = cast("AuditResult", shown)  # what _run returned: the summary's schema, checked by mypy
    num = lambda x: "-" if x is None else f"{x:.2f}"
    # One pair has a rho but no interval: a bootstrap over one pair is not an interval.
    bound = lambda x: "-" if x is None else f"{x:+.3f}"
    ci = lambda d: "-" if d["rho"] is None else f"{d['rho']:+.3f} [{bound(d['lo'])}, {bound(d['hi'])}]"
    prov = result["provenance"]
    print(f"{result['model']}\nmodel: {prov['model_path']} · data: {prov['data']}\n")
    from ..audit.report import findings_text  # imported by the run already

    print(findings_text(result["findings"]) + "\n")  # the page's opening paragraph, the same sentences
    cell = lambda x: "non-finite" if x is None else x  # noqa: E731  (NaN and inf are None once plain)
    print(table(["pair", "chosen", "rejected", "margin"],
                [(p["id"], cell(p["chosen"]), cell(p["rejected"]), cell(p["margin"])) for p in result["pairs"]]))
    sc = result["scores"]
    print(f"\n{sc['line']}")  # counted pairs, Wilson interval, and the pairs left out (non-finite), by id
    for pair, reason in result.get("skipped", {}).items():
        print(f"skipped pair {pair}: {reason} (every other pair was audited)")
    depth, iqr = result["lens"]["crystallization_median"], result["lens"]["crystallization_iqr"]
    print(f"median crystallization depth (l/L, fraction {result['lens']['fraction']}) [IQR]: "
          f"linear {num(depth['linear'])} [{num(iqr['linear'][0])}, {num(iqr['linear'][1])}], "
          f"normed {num(depth['normed'])} [{num(iqr['normed'][0])}, {num(iqr['normed'][1])}]")
    print(f"largest |reward − (Σ parts + constant)|: {result['closure_error']['max']:.2e}\n")
    _show_subsets(result["subsets"], ci)
    print("top parts by mean |total effect| (noising, read positions) next to their signed mean effects and exact "
          "direct attribution (OOD: patched runs out of distribution):")
    runs = result["n_pairs"]
    ood = lambda t: "-" if t["out_of_distribution_runs"] is None else f"{t['out_of_distribution_runs']}/{runs}"
    print(table(["part", "mean |total effect|", "total effect", "attribution", "direct effect", "indirect effect",
                 "OOD runs"],
                [(t["part"], t["mean_abs_total_effect"], t["total_effect"], t["attribution"], t["direct_effect"],
                  t["indirect_effect"], ood(t)) for t in result["top_parts"]]))
    fa = result["faithfulness"]
    print(f"\nattribution vs patching, mean per-pair Spearman ρ: direct {ci(fa['pooled']['direct'])}, "
          f"total {ci(fa['pooled']['total'])}; seed-paper statistic {ci(fa['seed_statistic'])} (the seed paper: "
          f"{SEED_PAPER})")
    if fa.get("paper_statistic") is not None:
        print(f"seed-paper statistic the paper's way (prefix noising, attention and MLP sublayers): "
              f"{ci(fa['paper_statistic'])}")
    if result["probes"] is not None:  # the findings, fragile flags apart, with the scale of the floor
        print(f"flagged probe axes: {result['probes']['headline']}")
    print(f"score parity: {result['parity_line'] or result['parity_note'] or 'not run'}")
    _show_more(result)
    kept = result.get("pairs_from_store")
    if kept:
        from ..audit import ResumeStatus  # imported by the run already: its wording of what a rerun reuses

        print(f"\nresumed: {ResumeStatus.reused(kept, result['n_pairs'])}, not computed again")
    print(f"\nreport: {result['report']}\nstore:  {result['store']}")


def _show_subsets(groups: dict[str, Any] | None, ci: Any) -> None:
    """Per-subset accuracy (Wilson interval), depth, seed statistic, and the top parts' effect per subset."""
    if groups is None:
        print("the pairs carry no subset field: no per-subset tables\n")
        return
    bound = lambda x: "-" if x is None else f"{x:.2f}"
    rows = []
    for name in groups["names"]:
        acc, seed = groups["accuracy"][name], groups["seed_statistic"][name]
        c = groups["crystallization"][name]["linear"]
        pairs = acc["n"] if acc["n"] == acc["total"] else f"{acc['n']} of {acc['total']}"  # non-finite left out
        rows.append((name, pairs, f"{bound(acc['accuracy'])} [{bound(acc['lo'])}, {bound(acc['hi'])}]",
                     f"{bound(c['median'])} [{bound(c['q25'])}, {bound(c['q75'])}]", ci(seed)))
    print("by subset (accuracy with 95% Wilson CI; linear-lens crystallization depth median [IQR]; seed statistic):")
    print(table(["subset", "pairs", "accuracy", "depth", "seed ρ"], rows))
    parts = groups["top_parts"]
    print("\nmean total effect of the top parts per subset (reward units):")
    print(table(["part", *groups["names"]], [(p, *(groups["top_parts"]["mean_total_effect"][s][k]
                                                   for s in groups["names"])) for k, p in enumerate(parts["parts"])]))
    print()


def _show_more(result: AuditSummary) -> None:
    """One line each: divergence of patched states, distortion, cascade clusters, conflicting terms, the circuit."""
    div, dist, casc, conf = (result[k] for k in ("divergence", "distortion", "cascades", "conflicts"))
    share = lambda x: "-" if x is None else f"{x:.2f}"  # None: undefined (no finite patched run)
    if div is not None:
        print(f"patched runs out of distribution: {share(div['flagged_share'])} of runs, carrying "
              f"{share(div['effect_share_flagged'])} of the total |effect|")
    if dist is not None:
        print(f"flagged distortion indices: {', '.join(dist['flagged']) or 'none'}")
    if casc is not None:
        print(f"cascade clusters: {'; '.join(' + '.join(g) for g in casc['clusters']) or 'none'}")
    if conf is not None:
        bad = [f"{r['term_a']} / {r['term_b']}" for r in conf["pairs"] if r["relation"] == "conflicting"]
        print(f"conflicting head terms: {', '.join(bad) or 'none'}")
    if result["circuit"] is not None:
        c = result["circuit"]
        pct = lambda x: "-" if x is None else f"{x:.1%}"  # None: non-finite (a mean margin of 0)
        print(f"circuit of the top {len(c['kept'])} sublayer edges carries {pct(c['share'])} of each pair's own clean "
              f"margin (|margin|-weighted; of the mean clean margin: {pct(c.get('share_of_mean_margin'))})")
        if c.get("warning"):  # a summary stored before the warning was kept has none
            print(c["warning"])
    if result["graphs"] is not None:
        score = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731  (None: undefined, once plain)
        print(f"attribution graphs ({result['graphs']['basis']}): " + "; ".join(
            f"pair {result['pairs'][p['pair']]['id']}: replacement {score(p['replacement'])}, completeness "
            f"{score(p['completeness'])}, {p['nodes']} nodes" for p in result["graphs"]["pairs"]))


def _check_probe_items(args: argparse.Namespace) -> None:
    """Refuse `--probe-items` where nothing reads items, then bound it (`check_probe_items`)."""
    if args.probe_items is not None and args.no_probes and args.no_concepts:
        raise ArgumentError(f"--probe-items {args.probe_items} picks the items of the probes and concepts, and "
                            "--no-probes --no-concepts skips both; drop --probe-items")
    check_probe_items(args, "the inputs a concept needs a side")


def _check(args: argparse.Namespace) -> None:
    _check_probe_items(args)
    check_out_folder(args.out, "--out folder")
    if args.store:
        check_out_file(args.store, "--store file")
    if args.sae is not None:
        check_folder(args.sae, "SAE folder")
        if args.sae_layer is None:
            raise ArgumentError("--sae PATH needs --sae-layer L (the residual layer the SAE was trained on)")
    elif args.sae_layer is not None or args.sae_any_model:
        raise ArgumentError(f"{'--sae-layer' if args.sae_layer is not None else '--sae-any-model'} needs --sae PATH")
    if args.transcoders is not None:
        if not args.graph:
            raise ArgumentError("--transcoders DIR is read by the attribution graphs only: add --graph, or drop it")
        check_folder(args.transcoders, "transcoder folder")


def _options(p: argparse.ArgumentParser) -> None:
    add_model_options(p, optional_model=True)
    add_pairs_options(p, required=False)
    p.add_argument("--out", default="rewardlens-audit", help="folder for report.html, numbers.json, *.parquet")
    p.add_argument("--store", default=None, help="results store (default OUT/results.sqlite); reruns resume it")
    p.add_argument("--chunk-size", type=positive(int), default=8, help="pairs per stored chunk")
    p.add_argument("--no-probes", action="store_true", help="skip the reward-hacking probes")
    p.add_argument("--no-concepts", action="store_true", help="skip concept directions and dose-response")
    p.add_argument("--no-tokens", action="store_true",
                   help="skip the token attribution of the 12 pairs with the largest |margin| (two forwards of them)")
    p.add_argument("--paper-statistic", action="store_true",
                   help="also compute the seed paper's (arXiv:2604.26130) statistic its own way: prefix noising over "
                        "attention and MLP "
                        "sublayers (one more patched forward of the chosen sides per sublayer)")
    p.add_argument("--no-divergence", action="store_true",
                   help="skip the divergence scores of patched states (one more head-level patching sweep)")
    p.add_argument("--circuit", action="store_true",
                   help="also find the circuit of the top 10 sublayer edges (EAP-IG) and its faithfulness curve: "
                        "5 backwards and a forward per circuit size, per pair (docs/circuits.md)")
    p.add_argument("--graph", action="store_true",
                   help="also build the margin attribution graphs of the first 3 pairs the report shows, over "
                        "--transcoders or (small models) the MLPs' own neurons, with one interactive page per pair "
                        "(docs/graphs.md)")
    p.add_argument("--transcoders", default=None,
                   help="transcoder folder for --graph (rewardlens transcoders train, sparsify or circuit-tracer)")
    add_probe_items_option(p, "probes and concepts")
    p.add_argument("--sae", default=None, help="an SAE folder: add SAE feature attribution")
    p.add_argument("--sae-layer", type=int, default=None, help="residual layer the SAE reads")
    p.add_argument("--sae-any-model", action="store_true",
                   help="accept an SAE recorded for another base model (a renamed copy or a fine-tune of it)")
    p.add_argument("--fraction", type=fraction, default=0.5, help="crystallization threshold (share of final margin)")
    p.add_argument("--top", type=positive(int), default=10, help="how many parts to list")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


COMMANDS = [Command("audit", "every instrument on the pairs → a resumable store and an HTML report", _options,
                    _audit, _show, check=_check)]
