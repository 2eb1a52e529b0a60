"""EAP and EAP-IG cost as a multiple of a plain forward, the speed-up over the naive edge-patching loop,
and the peak memory of the tensors edge attribution holds.

A tiny random Llama reward model (16 layers by default); interleaved rounds (A B A B ...), median and
range per method. Memory: on CUDA torch's peak allocation of one EAP call; everywhere the peak bytes of
the score-side tensors one batch holds at once (Δ of the parts in d-space, Δz of the heads, the node
gradients: the non-head receivers' from `node_grads`, the largest chunk `chunk_scores` is given, i.e.
one layer's heads), recorded at the functions that return or take them, with the d-space Δ the heads
would have needed beside it and the [B, D, m, d] gradient that chunking avoids.
Usage: python benchmarks/circuits.py [--rounds 5] [--pairs 2] [--layers 16]

`--agreement` prints instead how EAP and EAP-IG rank edges against true edge patching (`path_patch` per
edge) on the tests' tiny Llama and the `two_step` and `circuit` organisms (docs/circuits.md's table).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.helpers
from decompose import seconds  # noqa: E402

import rewardlens as rl  # noqa: E402
from rewardlens.causal import _edges  # noqa: E402  (the benchmark reads the engine's tensors, nothing else)
from rewardlens.zoo import DEMO_PAIRS, build_tokenizer  # noqa: E402


def build(root: Path, layers: int) -> rl.RewardModel:
    tok = build_tokenizer()
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    tf.LlamaForSequenceClassification(cfg).save_pretrained(root)
    tok.save_pretrained(root)
    return rl.load(str(root))


def _nbytes(x: object) -> int:
    """Bytes of the distinct tensor storages in `x` (a tensor, a dict of them, or a result holding `grad`)."""
    if isinstance(x, torch.Tensor):
        return x.untyped_storage().nbytes()
    if isinstance(x, dict):
        seen = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in x.values()}
        return sum(seen.values())
    return _nbytes(x.grad)  # type: ignore[attr-defined]  # a NodeGrads


@contextlib.contextmanager
def held(peaks: dict[str, int]) -> Iterator[None]:
    """Record the largest value each of Δ (`path_deltas`), Δz (`head_changes`) and g (`node_grads`) takes,
    and the largest gradient chunk (`chunk_scores`' last argument: at head level one layer's heads)."""
    names = ("path_deltas", "head_changes", "node_grads", "chunk_scores")
    saved = {name: getattr(_edges, name) for name in names}

    def wrap(name: str, fn: Callable) -> Callable:
        def inner(*args, **kwargs):  # type: ignore[no-untyped-def]
            out = fn(*args, **kwargs)
            held = args[-1] if name == "chunk_scores" else out
            peaks[name] = max(peaks.get(name, 0), _nbytes(held))
            return out
        return inner

    for name, fn in saved.items():
        setattr(_edges, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(_edges, name, fn)


def memory(model: rl.RewardModel, pairs: list, level: str) -> str:
    peaks: dict[str, int] = {}
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with held(peaks):
        scored = rl.edges(model, pairs, level=level)
    kib = {k: v / 2**10 for k, v in peaks.items()}
    heads = sum(u.startswith("attn_L") and "_H" in u for u in scored.upstream)
    dense = heads * len(pairs) * model.d_model * 4 / 2**10  # Δ_h in d-space at one column, fp32, every target
    whole = len(scored.downstream) * len(pairs) * model.d_model * 4 / 2**10  # g [B, D, m, d], one column
    line = (f"{level:8s}: held tensors Δ {kib.get('path_deltas', 0):.1f} KiB + Δz {kib.get('head_changes', 0):.1f} KiB "
            f"+ g {kib.get('node_grads', 0):.1f} KiB (non-head nodes); "
            f"largest g chunk {kib.get('chunk_scores', 0):.1f} KiB "
            f"(heads' Δ in d-space would be {dense:.1f} KiB, g of every node {whole:.1f} KiB)")
    if torch.cuda.is_available():
        line += f"; CUDA peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB"
    return line


def true_effects(model: rl.RewardModel, pairs: list, scored: rl.Edges, **corruption: object) -> list:
    """True edge patching: one `path_patch` per receiver over every upstream part written before it."""
    runs = []
    for j, d in enumerate(scored.downstream):
        ups = [u for i, u in enumerate(scored.upstream) if scored.valid[i, j]]
        if ups:
            runs.append(rl.path_patch(model, pairs, senders=ups, receivers=[d], **corruption))  # type: ignore[arg-type]
    return runs


def agreement_table() -> None:
    """EAP and EAP-IG against true edge patching (`Edges.agreement`, estimated edges only, k = 10) on the
    tests' tiny Llama (3 pairs) and the `two_step` and `circuit` organisms (20 held-out pairs each)."""
    from tests.helpers import tiny

    from rewardlens.calibrate import OrganismBench

    bench = OrganismBench(n_pairs=20, organisms=["two_step", "circuit"])
    llama = rl.load(str(tiny.build("llama", build_tokenizer(), Path(tempfile.mkdtemp()))))
    cases = [("tiny llama", llama, tiny.PAIRS, {}), ("two_step", bench.model("two_step"), bench.pairs("two_step"),
             {"positions": "all"}), ("circuit", bench.model("circuit"), bench.pairs("circuit"), {})]
    print("| model | level | edges | method | Spearman (means) | Spearman (per pair) | top-k overlap | "
          "same top edge: true top |")
    print("|---|---|---|---|---|---|---|---|")
    for name, model, pairs, kw in cases:
        for level in ("sublayer", "head"):
            eap = rl.edges(model, pairs, level=level, **kw)  # type: ignore[arg-type]
            truth = true_effects(model, pairs, eap, **kw)
            for method, scored in (("EAP", eap), ("EAP-IG (5)", rl.edges(model, pairs, level=level,
                                                                         method="eap-ig", **kw))):  # type: ignore[arg-type]
                k = 3 if level == "sublayer" else 10
                a = scored.agreement(truth, k=k)
                grid = scored.on_grid(truth)
                use = scored.valid & scored.approximate[None, :] & np.isfinite(grid).all(0)
                cells = [(scored.upstream[i], scored.downstream[j]) for i, j in zip(*np.nonzero(use))]
                first = [cells[int(np.argmax(np.abs(x[:, use].mean(0))))] for x in (grid, scored.score)]
                print(f"| {name} | {level} | {a['n_edges']:.0f} | {method} | {a['spearman_mean']:.2f} | "
                      f"{a['spearman_per_pair']:.2f} | {a['topk_overlap']:.2f} (k={k}) | "
                      f"{'yes' if first[0] == first[1] else 'no'}: {' → '.join(first[0])} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--agreement", action="store_true", help="print the agreement table instead of timings")
    args = ap.parse_args()
    if args.agreement:
        agreement_table()
        return
    model = build(Path(tempfile.mkdtemp()) / "m", args.layers)
    pairs = list(DEMO_PAIRS[:args.pairs])
    device = model.device
    calls = {
        "forward": lambda: model.score(pairs),
        "eap": lambda: rl.edges(model, pairs),
        "eap (heads)": lambda: rl.edges(model, pairs, level="head"),
        "eap-ig (5 steps)": lambda: rl.edges(model, pairs, method="eap-ig", steps=5),
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    for fn in calls.values():
        fn()  # warm-up
    for _ in range(args.rounds):
        for name, fn in calls.items():
            times[name].append(seconds(fn, device))
    scored = rl.edges(model, pairs)
    naive = seconds(lambda: [rl.path_patch(model, pairs, senders=[u], receivers=[d]) for u, d in scored.names[:20]],
                    device) / 20 * len(scored.names)
    base = np.median(times["forward"])
    for name, ts in times.items():
        med = np.median(ts)
        per = med / base / (5 if "ig" in name else 1)
        print(f"{name:18s} median {med * 1e3:8.1f} ms  range [{min(ts) * 1e3:.1f}, {max(ts) * 1e3:.1f}]  "
              f"{med / base:5.1f}x forward ({per:.1f}x per step)")
    print(f"naive loop (path_patch per edge, {len(scored.names)} edges, from 20): {naive:.2f} s, "
          f"EAP speed-up {naive / np.median(times['eap']):.0f}x")
    for level in ("sublayer", "head"):
        print(memory(model, pairs, level))


if __name__ == "__main__":
    main()
