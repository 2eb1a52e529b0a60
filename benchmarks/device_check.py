"""Every issue-5 instrument on an accelerator and a dtype, against the same model in fp32 on the CPU.

A random-init Llama reward model (3 outputs, read as objective 0, so conflicts have terms) is saved
with the demo tokenizer and loaded twice by `rewardlens.load`: fp32 on the CPU (the reference) and
`--dtype` on `--device`. On the same inputs it runs scoring, attribution (closure), probes,
concepts, conflicts and both edits, and prints, per instrument, the largest gap to the reference
and the figure that must hold on the device itself (closure, erasure). Random weights make the
effects noise; the point is that they are the same noise on both devices.

    python benchmarks/device_check.py --device cuda --dtype bfloat16
    python benchmarks/device_check.py                       # CPU vs CPU: every gap is ~0
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification
from transformers.utils.logging import disable_progress_bar

import rewardlens as rl
from rewardlens.hacking._axes import contrast_sets
from rewardlens.hacking._items import ITEMS
from rewardlens.zoo._builtin import build_tokenizer
from rewardlens.zoo.organisms import ORGANISMS


def build(folder: str, layers: int, hidden: int) -> None:
    tok = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 3,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4, num_labels=3,
                         max_position_embeddings=1024,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(folder)
    tok.save_pretrained(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--items", type=int, default=24, help="built-in probe items")
    args = ap.parse_args()
    disable_progress_bar()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    folder = tempfile.mkdtemp()
    build(folder, args.layers, args.hidden)
    ref = rl.load(folder, readout=0)
    dev = rl.load(folder, readout=0, device=args.device, dtype=args.dtype)
    items = list(ITEMS[: args.items])
    pairs = ORGANISMS["two_objective"].pairs(24, seed=1)
    pos, neg = contrast_sets("formatting", items)
    rows = []

    def check(name: str, fn, compare) -> None:
        started = time.perf_counter()
        a, b = fn(ref), fn(dev)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        rows.append((name, *compare(a, b), time.perf_counter() - started))

    gap = lambda a, b: float(np.nanmax(np.abs(np.asarray(a, float) - np.asarray(b, float))))
    scale = lambda a: float(np.nanmax(np.abs(np.asarray(a, float))))
    check("score", lambda m: m.score(pairs), lambda a, b: (gap(a, b), scale(a), "-"))
    check("attribute (head)", lambda m: rl.attribute(m, pairs, level="head"),
          lambda a, b: (gap(a.margin, b.margin), scale(a.margin), f"closure {np.abs(b.residual_error).max():.2e}"))
    check("probe", lambda m: rl.probe(m, items, n_boot=200),
          lambda a, b: (gap(a.delta, b.delta), scale(a.delta), f"flags equal: {bool((a.flagged == b.flagged).all())}"))
    check("concepts", lambda m: rl.concepts(m, {"formatting": (pos, neg)}, n_boot=200),
          lambda a, b: (gap(a.slope, b.slope), scale(a.slope), f"cosine gap {gap(a.cosine, b.cosine):.2e}"))
    check("conflict", lambda m: rl.hacking.conflict(m, pairs, n_boot=200),
          lambda a, b: (gap(a.margins, b.margins), scale(a.margins),
                        f"relations equal: {bool((a.relation == b.relation).all())}"))
    for method in ("project", "leace"):
        def erased(m, method=method):
            r = rl.edit(m, pos, neg, method=method).model.score(pos + neg)
            return r, abs(r[: len(pos)].mean() - r[len(pos):].mean())  # erased: the two sets' mean rewards agree
        check(f"edit ({method})", erased,
              lambda a, b: (gap(a[0], b[0]), scale(a[0]), f"class-mean reward gap after edit {b[1]:.2e}"))
    print(f"device {args.device}, dtype {args.dtype}, {args.layers} layers x {args.hidden}; reference: CPU fp32")
    print(f"{'instrument':18} {'max |gap|':>10} {'max |ref|':>10}  {'relative':>9}  {'seconds':>8}  device figure")
    for name, g, s, note, sec in rows:
        print(f"{name:18} {g:10.3e} {s:10.3e}  {g / s if s else float('nan'):9.2e}  {sec:8.2f}  {note}")


if __name__ == "__main__":
    main()
