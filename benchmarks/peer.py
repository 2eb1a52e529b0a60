"""rewardlens side by side with the peer library reward-lens 3.1.0, same model, same pairs, interleaved rounds.

The real SmolLM2-135M reward model (`rewardlens.zoo.realmodels`, trained head, as benchmarks/audit.py loads it)
on held-out dpo_en_demo pairs. The peer gets the *same* Hugging Face model object and tokenizer through its
no-download entry point `reward_lens.signals.wrap_hf_model`, and the same pairs as `(prompt, chosen, rejected)`
triples. The peer takes a prompt as one string (it stringifies a message list), so only pairs whose prompt is a
single user turn are used, and every sequence is checked to tokenize to the same ids in both libraries.

Four instruments (attribution at two levels), each timed for both libraries (ours, then the peer's, every round):

- `lens`: `rl.lens` | the peer's `LensCrystallization` Observable (`measure.run(obs, Context(signal, view))`).
- `attribution sublayer`: `rl.attribute` | `DirectLinearAttribution` (embed, attn_L*, mlp_L*).
- `attribution head`: `rl.attribute(level="head")` | the peer has no head Observable: its canonical
  `attribution.head_reward_contributions` on `o_proj` inputs captured by `signal.capture` at the final token.
- `patch read`: `rl.patch` (noising, read token, sublayers, total) | the peer patches only whole prefixes, so
  its own `ComponentPatch` + `run_patched_scores` with a source equal to the clean chosen activation whose
  read token holds the rejected one (the patch then changes only the read token).
- `patch prefix`: `rl.patch(positions="prefix", level="sublayer")`, the seed paper's estimand | `PatchGrid`
  (component granularity: the first min(len) positions, rejected into chosen).

Both patch sweeps are compared on the peer's parts (attn_L*, mlp_L*); ours also patches `embed` (61 parts to 60).

Each round times every instrument, ours then the peer's (A B A B ...), after one warm-up round on one pair;
ratios peer/ours are taken within a round and reported as median [min, max] over rounds. Then the check,
on the last round's results: where both compute the same number (the clean margin, both patching effects)
they must match to float precision; where they define the number differently (the peer projects the
*pre-norm* residual on the head's weight, design.md section 1, so its lens does not end at the reward and its
attribution does not sum to it) it prints how far apart they are and how well the two correlate.

The peer must not be installed into this environment (its dependencies would change ours). Unpack it beside:

    pip install --no-deps --target /tmp/peerlib reward-lens==3.1.0 pydantic-settings python-dotenv
    PYTHONPATH=/tmp/peerlib python benchmarks/peer.py               # 2 pairs <= 160 tokens, 5 rounds, 1 thread: ~10 min
    PYTHONPATH=/tmp/peerlib python benchmarks/peer.py --rounds 2                    # ~5 min

(`pydantic-settings` and `python-dotenv` are the peer's two pure-python imports that this environment lacks;
its other declared dependencies are not imported on these paths.) Without the peer it prints one line and
exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from decompose import timed

import rewardlens as rl
from rewardlens.zoo.realmodels import dpo_pairs, load_reward_model

PEER = "reward-lens==3.1.0"
PEER_MODULES = ("reward_lens.signals", "reward_lens.measure.base", "reward_lens.measure.battery",
                "reward_lens.interventions", "reward_lens.attribution", "reward_lens.runtime.hooks")
INSTRUMENTS = ("lens", "attribution sublayer", "attribution head", "patch read", "patch prefix")
Triple = tuple[str, str, str]
Calls = dict[str, Callable[[], Any]]


def require_peer() -> None:
    """Exit 0 with one line when the peer (or one of its light imports) is not importable: the benchmark skips."""
    try:
        peer = importlib.import_module("reward_lens")
        for name in PEER_MODULES:
            importlib.import_module(name)
    except ImportError as exc:
        print(f"skipping: the peer library {PEER} is not importable ({exc}); unpack it beside this environment, "
              f"not into it: pip install --no-deps --target DIR {PEER} pydantic-settings python-dotenv, "
              f"then run with PYTHONPATH=DIR")
        sys.exit(0)
    if peer.__version__ != PEER.split("==")[1]:
        print(f"note: measuring reward-lens {peer.__version__}, not {PEER}")


# --------------------------------------------------------------------------- pairs


def user_prompt(pair: rl.Pair) -> str | None:
    """The prompt as the one string the peer takes, or None when it is more than one user turn."""
    if isinstance(pair.prompt, str):
        return pair.prompt
    turns = pair.prompt
    return str(turns[0]["content"]) if len(turns) == 1 and turns[0]["role"] == "user" else None


def select_pairs(model: rl.RewardModel, n: int, max_tokens: int) -> list[rl.Pair]:
    """The first `n` held-out pairs with a single-turn prompt and both sides at most `max_tokens` long."""
    chosen = []
    for pair in dpo_pairs("test"):
        if user_prompt(pair) is not None and max(len(s.ids) for s in model.encode([pair])[0]) <= max_tokens:
            chosen.append(pair)
    if len(chosen) < n:
        print(f"note: only {len(chosen)} held-out pairs have a single-turn prompt and sides <= {max_tokens} tokens")
    return chosen[:n]


def peer_triples(model: rl.RewardModel, signal: Any, pairs: Sequence[rl.Pair]) -> list[Triple]:
    """The pairs as the peer's `(prompt, chosen, rejected)` triples, refused unless every side has our ids."""
    seqs, _ = model.encode(pairs)
    triples = []
    for i, pair in enumerate(pairs):
        prompt = user_prompt(pair)
        assert prompt is not None  # select_pairs kept only single-turn prompts
        for j, response in enumerate((pair.chosen, pair.rejected)):
            if list(signal.tokenize((prompt, response)).input_ids) != list(seqs[2 * i + j].ids):
                sys.exit(f"pair {pair.id}: the peer tokenizes side {j} differently; no comparison is possible")
        triples.append((prompt, pair.chosen, pair.rejected))
    return triples


# --------------------------------------------------------------------------- the peer's instruments


def peer_observable(signal: Any, triples: list[Triple], observable: Any) -> dict[str, Any]:
    """Payload of one peer Observable run as its docs run it: `run(obs, Context(signal=..., view=...))`."""
    from reward_lens.measure.base import Context, run

    return dict(run(observable, Context(signal=signal, view=triples)).value)


def capture(signal: Any, items: list[tuple[str, str]], sites: tuple[Any, ...], full: bool) -> dict[Any, torch.Tensor]:
    """The peer's `signal.capture` at `sites` in fp32: at the final token (B, d), or every token (B, T, d)."""
    from reward_lens.runtime.backend import CaptureSpec
    from reward_lens.signals import PositionSpec

    spec = CaptureSpec(sites=sites, position=PositionSpec("final"), full_sequence=full, dtype="float32")
    return dict(next(iter(signal.capture(items, spec))).tensors)


def peer_head_attribution(signal: Any, triples: list[Triple]) -> np.ndarray:
    """Chosen − rejected contribution of every head [n_pairs, L*H] (layer-major), the peer's canonical
    `head_reward_contributions` on the `o_proj` inputs at the final token of each side."""
    from reward_lens.attribution import head_reward_contributions
    from reward_lens.core.types import Site
    from reward_lens.runtime.hooks import resolve_module

    n_layers, n_heads = int(signal.meta.n_layers), int(signal.meta.n_heads)
    sites = tuple(Site(layer, "head_out", h) for layer in range(n_layers) for h in range(n_heads))
    w_r, runtime = signal.readout("reward").vector, signal.runtime
    o_proj = [resolve_module(runtime.model, runtime.site_map.resolve(Site(layer, "head_out", None))).weight
              for layer in range(n_layers)]
    sides = []
    for items in ([(p, c) for p, c, _ in triples], [(p, r) for p, _, r in triples]):
        cap = capture(signal, items, sites, full=False)
        sides.append(np.concatenate([
            head_reward_contributions(torch.stack([cap[Site(layer, "head_out", h)] for h in range(n_heads)], 1),
                                      o_proj[layer], w_r, n_heads)
            for layer in range(n_layers)], axis=1))
    return sides[0] - sides[1]


def sublayer_sites(signal: Any) -> tuple[Any, ...]:
    """attn_out and mlp_out of every layer, in the order `PatchGrid` names them (attn_L0, mlp_L0, ...)."""
    from reward_lens.core.types import Site

    return tuple(Site(layer, point) for layer in range(int(signal.meta.n_layers)) for point in ("attn_out", "mlp_out"))


def peer_read_patch(signal: Any, triples: list[Triple]) -> np.ndarray:
    """Noising effect of patching each sublayer at the read (final) token only [n_pairs, 2L], with the peer's
    own `ComponentPatch`: a same-length source replaces the activation outright, so the source is the clean
    chosen activation with the rejected read-token activation spliced in. effect = clean − patched chosen."""
    from reward_lens.interventions import ComponentPatch, run_patched_scores

    sites = sublayer_sites(signal)
    effects = np.zeros((len(triples), len(sites)))
    for i, (prompt, chosen, rejected) in enumerate(triples):
        item = (prompt, chosen)
        clean = capture(signal, [item], sites, full=True)
        source = capture(signal, [(prompt, rejected)], sites, full=True)
        reward = float(signal.score([item]).value.values[0])
        for j, site in enumerate(sites):
            spliced = clean[site].clone()
            spliced[:, -1] = source[site][:, -1]
            patched = run_patched_scores(signal, ComponentPatch(site=site, source=spliced).compile(signal), [item])
            effects[i, j] = reward - float(patched[0])
    return effects


def peer_calls(signal: Any, triples: list[Triple]) -> Calls:
    """Each instrument as a peer user calls it."""
    from reward_lens.measure.battery import DirectLinearAttribution, LensCrystallization, PatchGrid

    return {
        "lens": lambda: peer_observable(signal, triples, LensCrystallization()),
        "attribution sublayer": lambda: peer_observable(signal, triples, DirectLinearAttribution()),
        "attribution head": lambda: peer_head_attribution(signal, triples),
        "patch read": lambda: peer_read_patch(signal, triples),
        "patch prefix": lambda: peer_observable(signal, triples, PatchGrid("component")),
    }


def our_calls(model: rl.RewardModel, pairs: list[rl.Pair]) -> Calls:
    """Each instrument as a rewardlens user calls it."""
    return {
        "lens": lambda: rl.lens(model, pairs),
        "attribution sublayer": lambda: rl.attribute(model, pairs),
        "attribution head": lambda: rl.attribute(model, pairs, level="head"),
        "patch read": lambda: rl.patch(model, pairs),
        "patch prefix": lambda: rl.patch(model, pairs, positions="prefix", level="sublayer"),
    }


# --------------------------------------------------------------------------- timing


def one_round(ours: Calls, peer: Calls, device: torch.device, out: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """(our seconds, peer seconds) per instrument, ours first; the results land in `out` as (ours, peer)."""
    times = {}
    for name in INSTRUMENTS:
        t_ours, got_ours = timed(ours[name], device)
        t_peer, got_peer = timed(peer[name], device)
        times[name], out[name] = (t_ours, t_peer), (got_ours, got_peer)
    return times


def report_times(rounds: list[dict[str, tuple[float, float]]]) -> None:
    print(f"\n{'instrument':<22} {'ours s':>8} {'peer s':>8}   peer/ours, median [min, max] over rounds")
    for name in INSTRUMENTS:
        ours, peer = (np.array([r[name][k] for r in rounds]) for k in (0, 1))
        ratio = peer / ours
        print(f"{name:<22} {np.median(ours):8.2f} {np.median(peer):8.2f}   "
              f"{np.median(ratio):7.1f}x [{ratio.min():.1f}, {ratio.max():.1f}]")


# --------------------------------------------------------------------------- agreement


def corr(a: np.ndarray, b: np.ndarray) -> str:
    """Pearson r of each row of `a` with the same row of `b`, as 'median [min]' over rows."""
    r = np.array([np.corrcoef(x, y)[0, 1] for x, y in zip(a, b)])
    return f"{np.median(r):.3f} [min {r.min():.3f}]"


def columns(names: list[str], wanted: Sequence[str]) -> list[int]:
    """Indices of `wanted` parts in our `names`."""
    index = {n: i for i, n in enumerate(names)}
    return [index[n] for n in wanted]


def check_lens(ours: rl.Lens, peer: dict[str, Any], margin: np.ndarray) -> None:
    theirs = np.asarray(peer["differential"])  # [n_pairs, L+1]: embeddings, then each layer's resid_post
    linear, normed = (np.abs(end - ours.reward).max() for end in (ours.linear[:, -1], ours.normed[:, -1]))
    print(f"lens: ours ends at the reward (max |last depth - reward| linear {linear:.1e}, normed {normed:.1e}); "
          f"the peer's last margin is w.(pre-norm residual), max |it - reward margin| "
          f"{np.abs(theirs[:, -1] - margin).max():.3f} (|reward margins| {np.abs(margin).min():.3f}-"
          f"{np.abs(margin).max():.3f}); margin curves over depth correlate r = {corr(ours.margin('linear'), theirs)}")


def check_attribution(sub: rl.Attribution, peer_sub: dict[str, Any], heads: rl.Attribution,
                      peer_heads: np.ndarray, margin: np.ndarray, n_heads: int) -> None:
    names = list(peer_sub["component_names"])
    theirs = np.asarray(peer_sub["differential"])
    print(f"attribution sublayer: ours sums to the reward (max |residual_error| "
          f"{np.abs(sub.residual_error).max():.1e}); the peer's sum misses the reward margin by up to "
          f"{np.abs(theirs.sum(1) - margin).max():.3f}; per-part margins correlate r = "
          f"{corr(sub.margin[:, columns(sub.names, names)], theirs)}")
    head_names = [f"attn_L{i // n_heads}_H{i % n_heads}" for i in range(peer_heads.shape[1])]
    print(f"attribution head: ours sums to the reward (max |residual_error| {np.abs(heads.residual_error).max():.1e}); "
          f"per-head margins correlate r = {corr(heads.margin[:, columns(heads.names, head_names)], peer_heads)}")


def check_patch(label: str, ours: rl.Patching, theirs: np.ndarray, names: list[str]) -> None:
    mine = ours.effect[:, columns(ours.names, names)]
    print(f"{label}: the same effects, max |ours - peer| {np.abs(mine - theirs).max():.1e} "
          f"(largest |effect| {np.abs(mine).max():.3f}); r = {corr(mine, theirs)}")


def check(results: dict[str, Any], n_heads: int) -> None:
    """Print where the two libraries agree, on the last round's results."""
    read, peer_read = results["patch read"]
    prefix, grid = results["patch prefix"]
    margin = read.margin
    print("\nagreement (last round):")
    clean = np.abs(margin - np.asarray(grid["original_differential"])).max()
    print(f"clean reward margin: max |ours - peer| {clean:.1e}")
    lens, peer_lens = results["lens"]
    check_lens(lens, peer_lens, margin)
    (sub, peer_sub), (heads, peer_heads) = results["attribution sublayer"], results["attribution head"]
    check_attribution(sub, peer_sub, heads, peer_heads, margin, n_heads)
    names = list(grid["component_names"])
    check_patch("patch read", read, peer_read, names)
    check_patch("patch prefix", prefix, np.asarray(grid["per_pair_effect"]), names)


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=2, help="held-out pairs (single-turn prompts)")
    ap.add_argument("--max-tokens", type=int, default=160, help="use pairs whose sides are at most this long")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (after one warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    require_peer()
    from reward_lens.signals import wrap_hf_model

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    model = load_reward_model("smollm2-dpo")
    pairs = select_pairs(model, args.pairs, args.max_tokens)
    signal = wrap_hf_model(model.model, model.tokenizer)  # the same module and tokenizer objects as ours
    triples = peer_triples(model, signal, pairs)
    lengths = [len(s.ids) for s in model.encode(pairs)[0]]
    print(f"model: SmolLM2-135M reward model ({model.n_layers} layers, {model.n_heads} heads), cpu float32, "
          f"{args.threads} thread(s); {len(pairs)} pairs, {min(lengths)}-{max(lengths)} tokens a side; "
          f"{args.rounds} interleaved rounds (plus one warm-up); peer {PEER}")
    ours, peer = our_calls(model, pairs), peer_calls(signal, triples)
    results: dict[str, Any] = {}
    one_round(our_calls(model, pairs[:1]), peer_calls(signal, triples[:1]), device, {})  # warm-up
    rounds = [one_round(ours, peer, device, results) for _ in range(args.rounds)]
    report_times(rounds)
    check(results, model.n_heads)


if __name__ == "__main__":
    main()
