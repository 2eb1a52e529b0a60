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
from typing import TYPE_CHECKING, Any

import numpy as np

from ..audit import Audit, Plan, Store, collect, run_pairs, run_whole
from ..data import Pair, load_pairs
from ..model import RewardModel
from ._common import (
    Command,
    add_model_options,
    add_pairs_options,
    fraction,
    load_model,
    positive,
    read_pairs,
    table,
)

if TYPE_CHECKING:
    from ..sae import TopKSAE


def _inputs(args: argparse.Namespace) -> tuple[RewardModel, list[Pair]]:
    if args.model is not None:
        return load_model(args), read_pairs(args)
    from ..zoo import AUDIT_PAIRS, DEMO_ORGANISM, demo_model_dir
    from ..zoo.organisms import READY, organism_dir

    quiet = args.json or _rank()[0] != 0
    if not (organism_dir(DEMO_ORGANISM) / READY).exists() and not quiet:
        print("training the demo organism once (about 15 s; cached afterwards) ...", file=sys.stderr)
    args.model = str(demo_model_dir())
    pairs = load_pairs(args.pairs, limit=args.limit) if args.pairs else AUDIT_PAIRS[: args.limit]
    if not quiet:
        print(f"auditing the built-in demo model: the {DEMO_ORGANISM!r} model organism, a tiny Llama reward model "
              "trained\non synthetic pairs whose chosen answer always agrees with the user's stated view.")
        if not args.pairs:
            print("In the built-in pairs the user states a mistaken view; chosen corrects it, rejected agrees.\n"
                  "A sycophantic model prefers the rejected side: expect negative margins and low accuracy.")
        print()
    return load_model(args), pairs


def _rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) outside it."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))


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
    rank, world = _distributed(args)
    model, pairs = _inputs(args)
    if not pairs:
        raise ValueError("no pairs to audit")
    out = Path(args.out)
    main_path = Path(args.store) if args.store else out / "results.sqlite"
    plan = Plan(chunk_size=args.chunk_size, batch_size=args.batch_size, probes=not args.no_probes,
                concepts=not args.no_concepts, probe_items=args.probe_items, sae_layer=args.sae_layer,
                fraction=args.fraction)
    sae = _sae(args, model)
    progress = not args.quiet
    main_store = Store(main_path)
    try:
        if world == 1:
            run_pairs(model, pairs, main_store, plan, progress=progress)
        else:
            shard = Store(main_path.with_name(f"{main_path.stem}.rank{rank}{main_path.suffix}"))
            try:
                run_pairs(model, pairs, shard, plan, rank=rank, world_size=world, progress=progress,
                          skip=main_store)
            finally:
                shard.close()
            import torch.distributed as dist

            dist.barrier()  # every shard is complete before rank 0 reads them
            if rank != 0:
                dist.destroy_process_group()
                return {"rank": rank}
            for r in range(world):
                main_store.merge(main_path.with_name(f"{main_path.stem}.rank{r}{main_path.suffix}"))
            dist.destroy_process_group()
        run_whole(model, pairs, main_store, plan, sae=sae, progress=progress)
        result = collect(model, pairs, main_store, plan, sae=sae)
    finally:
        main_store.close()
    from ..audit.report import write_report

    report = write_report(result, out)
    return {**_result(result, args.top), "report": str(report), "store": str(main_path)}


def _sae(args: argparse.Namespace, model: RewardModel) -> TopKSAE | None:
    if args.sae is None:
        if args.sae_layer is not None:
            raise ValueError("--sae-layer needs --sae PATH")
        return None
    if args.sae_layer is None:
        raise ValueError("--sae PATH needs --sae-layer L (the residual layer the SAE was trained on)")
    from ..sae import load_sae

    return load_sae(args.sae, device=model.device)


def _result(audit: Audit, top: int) -> dict[str, Any]:
    """numbers.json's summary plus the per-pair scores and the parts with the largest total effect."""
    from ..audit.report import margins, plain, summary

    chosen, rejected, margin = margins(audit)
    f = audit.faithfulness
    att, total, direct = f.attribution.mean(0), f.total.mean(0), f.direct.mean(0)
    order = np.argsort(-np.abs(total), kind="stable")[:top]
    return plain({
        **summary(audit),
        "pairs": [{"id": pid, "chosen": chosen[i], "rejected": rejected[i], "margin": margin[i]}
                  for i, pid in enumerate(audit.pair_ids)],
        "top_parts": [{"part": f.names[i], "attribution": att[i], "total_effect": total[i], "direct_effect": direct[i]}
                      for i in order],
    })


def _show(result: dict[str, Any]) -> None:
    if "rank" in result:  # ranks other than 0 print nothing: rank 0 reports for all
        return
    num = lambda x: "-" if x is None else f"{x:.2f}"
    ci = lambda d: "-" if d["rho"] is None else f"{d['rho']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"
    print(result["model"] + "\n")
    print(table(["pair", "chosen", "rejected", "margin"],
                [(p["id"], p["chosen"], p["rejected"], p["margin"]) for p in result["pairs"]]))
    print(f"\npair accuracy: {result['scores']['accuracy']:.3f} over {result['n_pairs']} pairs")
    depth = result["lens"]["crystallization_median"]
    print(f"median crystallization depth (l/L, fraction {result['lens']['fraction']}): "
          f"linear {num(depth['linear'])}, normed {num(depth['normed'])}")
    print(f"largest |reward − (Σ parts + constant)|: {result['closure_error']['max']:.2e}\n")
    print("top parts by |total effect, noising, read positions| next to their exact direct attribution:")
    print(table(["part", "attribution", "total effect", "direct effect"],
                [(t["part"], t["attribution"], t["total_effect"], t["direct_effect"]) for t in result["top_parts"]]))
    fa = result["faithfulness"]
    print(f"\nattribution vs patching, mean per-pair Spearman ρ: direct {ci(fa['pooled']['direct'])}, "
          f"total {ci(fa['pooled']['total'])}; seed-paper statistic {ci(fa['seed_statistic'])}")
    if result["probes"] is not None:
        flagged = result["probes"]["flagged"]
        print(f"flagged probe axes: {', '.join(flagged) if flagged else 'none'}")
    print(f"\nreport: {result['report']}\nstore:  {result['store']}")


def _options(p: argparse.ArgumentParser) -> None:
    add_model_options(p, optional_model=True)
    add_pairs_options(p, required=False)
    p.add_argument("--out", default="rewardlens-audit", help="folder for report.html, numbers.json, *.parquet")
    p.add_argument("--store", default=None, help="results store (default OUT/results.sqlite); reruns resume it")
    p.add_argument("--chunk-size", type=positive(int), default=8, help="pairs per stored chunk")
    p.add_argument("--no-probes", action="store_true", help="skip the reward-hacking probes")
    p.add_argument("--no-concepts", action="store_true", help="skip concept directions and dose-response")
    p.add_argument("--probe-items", type=positive(int), default=None,
                   help="a quick run: probes and concepts on only N of the 72 built-in items")
    p.add_argument("--sae", default=None, help="an SAE folder: add SAE feature attribution")
    p.add_argument("--sae-layer", type=int, default=None, help="residual layer the SAE reads")
    p.add_argument("--fraction", type=fraction, default=0.5, help="crystallization threshold (share of final margin)")
    p.add_argument("--top", type=positive(int), default=10, help="how many parts to list")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


COMMANDS = [Command("audit", "every instrument on the pairs → a resumable store and an HTML report", _options,
                    _audit, _show)]
