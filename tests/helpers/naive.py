"""The naive patching yardstick: one full, unpadded Hugging Face forward per (pair, part), read
from the model's own output. Slow on purpose and independent of the engine: it shares only the
site list (names and module paths) with the library.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from rewardlens.causal._engine import Site, head_slice, sites
from rewardlens.model.internal import get_module


def _module(model, site: Site):
    if site.kind == "embed":
        return model.layers[0], "in"
    path = model.arch.attn_out if site.kind == "attn" else model.arch.mlp_out
    return model.layer_module(site.layer, path), "in" if site.head is not None else "out"


@contextlib.contextmanager
def _hook(module, where: str, fn):
    """`fn(tensor) -> tensor` on the module's first input or its output."""
    if where == "in":
        def pre(m, args, kwargs):
            if args:
                return (fn(args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}
        handle = module.register_forward_pre_hook(pre, with_kwargs=True)
    else:
        def post(m, args, out):
            return (fn(out[0]), *out[1:]) if isinstance(out, tuple) else fn(out)
        handle = module.register_forward_hook(post)
    try:
        yield
    finally:
        handle.remove()


def _forward(model, seq) -> float:
    kwargs = {"input_ids": torch.tensor([seq.ids])}
    if seq.type_ids is not None:
        kwargs["token_type_ids"] = torch.tensor([seq.type_ids])
    with torch.no_grad():
        out = model.model(**kwargs)
    score = getattr(out, "score", None)
    return float(score[0]) if score is not None else float(out.logits[0, 0])


def _capture_all(model, seq, sweep: list[Site]) -> dict:
    """One clean forward: every site's full activation [T, width] (heads: the whole projection input),
    every sublayer output, and the gate's output."""
    store, targets = {}, {}
    for site in sweep:
        targets[site.key] = _module(model, site)
    for layer in range(model.n_layers):
        for kind in ("attn", "mlp"):
            mod = model.layer_module(layer, model.arch.attn_out if kind == "attn" else model.arch.mlp_out)
            targets[f"out_{kind}_{layer}"] = (mod, "out")
    if model.arch.head_kind == "gated":
        targets["gate"] = (get_module(model.model, model.arch.gate), "out")
    with contextlib.ExitStack() as stack:
        for key, (module, where) in targets.items():
            def keep(x, key=key):
                store[key] = x.detach().clone()
                return x
            stack.enter_context(_hook(module, where, keep))
        _forward(model, seq)
    return store


def _later(model, site: Site) -> list[tuple[str, int]]:
    """Sublayer outputs downstream of the site (parallel-residual MLPs read the layer's input, not attn)."""
    out = []
    for layer in range(model.n_layers):
        for kind in ("attn", "mlp"):
            same_layer_mlp = (layer == site.layer and site.kind == "attn" and kind == "mlp"
                              and model.arch.layout != "parallel")
            if site.kind == "embed" or layer > site.layer or same_layer_mlp:
                out.append((kind, layer))
    return out


def _read(seq_len: int, read: int, positions) -> list[int]:
    if positions == "read":
        return [read]
    if positions == "all":
        return list(range(seq_len))
    cols = []
    for span in positions:
        cols += [c for c in range(read + 1)[slice(*span)] if c not in cols]
    return cols


def naive_patch(model, pairs, *, mode="noising", ablation="zero", positions="read", level="sublayer",
                estimand="total") -> tuple[np.ndarray, np.ndarray]:
    """Patched chosen and rejected rewards [n, S] by brute force."""
    seqs, _ = model.encode(pairs)
    read = [int(model.batches([s], 1).__next__()[1].read_index[0]) for s in seqs]
    sweep = sites(model, level)
    n = len(seqs) // 2
    clean = np.array([_forward(model, s) for s in seqs])
    out = np.repeat(clean[:, None], len(sweep), 1)
    if mode == "ablation":
        jobs = [(t, None) for t in range(2 * n)]
    else:
        jobs = [(2 * i, 2 * i + 1) if mode == "noising" else (2 * i + 1, 2 * i) for i in range(n)]
    acts = [_capture_all(model, seq, sweep) for seq in seqs]
    for s_idx, site in enumerate(sweep):
        sl = head_slice(model, site)
        mean = None
        if mode == "ablation" and ablation == "mean":
            full = [a[site.key][0, :, sl] for a in acts]
            mean = torch.stack([f[read[i]] for i, f in enumerate(full)]).mean(0) if positions == "read" \
                else torch.cat(full).mean(0)
        for t, s in jobs:
            if positions == "prefix":  # the seed paper's rule: the pair's first min(len) positions on both sides
                shared = min(len(seqs[2 * (t // 2)].ids), len(seqs[2 * (t // 2) + 1].ids))
                cols_t = cols_s = list(range(shared))
            else:
                cols_t = _read(len(seqs[t].ids), read[t], positions)
                cols_s = None if s is None else _read(len(seqs[s].ids), read[s], positions)
            src = None if s is None else acts[s][site.key][0, cols_s][:, sl]

            def put(x, cols_t=cols_t, src=src, mean=mean, sl=sl):
                x = x.clone()
                x[0, cols_t, sl] = 0 if src is None and mean is None else (src if src is not None else mean).to(x.dtype)
                return x

            module, where = _module(model, site)
            with contextlib.ExitStack() as stack:
                stack.enter_context(_hook(module, where, put))
                if estimand == "direct":  # every later part (and the gate) held at its clean value
                    for kind, layer in _later(model, site):
                        mod = model.layer_module(layer, model.arch.attn_out if kind == "attn" else model.arch.mlp_out)
                        frozen = acts[t][f"out_{kind}_{layer}"]
                        stack.enter_context(_hook(mod, "out", lambda x, f=frozen: f.to(x.dtype)))
                    if "gate" in acts[t]:
                        frozen = acts[t]["gate"]
                        stack.enter_context(_hook(get_module(model.model, model.arch.gate), "out",
                                                  lambda x, f=frozen: f.to(x.dtype)))
                out[t, s_idx] = _forward(model, seqs[t])
    return out[0::2], out[1::2]
