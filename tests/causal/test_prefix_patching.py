"""positions='prefix' (the seed paper's whole-prefix rule) against the reference engine (one forward per part)."""

import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens import Pair
from rewardlens.causal import patch
from rewardlens.errors import RewardLensWarning
from rewardlens.model.internal import tokenize
from tests.helpers.tiny import ARCHS

CASES = [(mode, estimand) for mode in ("noising", "denoising") for estimand in ("total", "direct")]


def _lengths(model, pairs):
    seqs, _ = model.encode(pairs)
    return np.array([len(s.ids) for s in seqs[0::2]]), np.array([len(s.ids) for s in seqs[1::2]])


def _reference(model, pairs, **kwargs):
    """Patched chosen and rejected rewards [n, S] of the reference engine, prefix positions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RewardLensWarning)
        got = patch(model, pairs, positions="prefix", engine="reference", **kwargs)
    return got.patched_chosen, got.patched_rejected


def _patch(model, pairs, **kwargs):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = patch(model, pairs, positions="prefix", batch_size=2, **kwargs)
    prefix = [w for w in seen if issubclass(w.category, RewardLensWarning) and "positions='prefix'" in str(w.message)]
    return got, prefix


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_patching_equals_the_reference(tiny_root, pairs, arch):
    model = rl.load(str(tiny_root[arch]))
    n_chosen, n_rejected = _lengths(model, pairs)
    assert (n_chosen > n_rejected).any() and (n_chosen < n_rejected).any(), "the pairs must differ both ways"
    for mode, estimand in CASES:
        got, said = _patch(model, pairs, mode=mode, estimand=estimand)
        want_c, want_r = _reference(model, pairs, mode=mode, estimand=estimand)
        np.testing.assert_allclose(got.patched_chosen, want_c, atol=2e-5, rtol=1e-5, err_msg=f"{mode}/{estimand}")
        np.testing.assert_allclose(got.patched_rejected, want_r, atol=2e-5, rtol=1e-5, err_msg=f"{mode}/{estimand}")
        assert np.abs(got.effect).max() > 1e-5, f"{mode}/{estimand}: every effect is zero, the check would be empty"
        assert got.positions == "prefix"
        # The read token is left out where the patched side is the longer one (decoders read the
        # last token; encoders read the first, always inside the prefix).
        longer = n_chosen > n_rejected if mode == "noising" else n_rejected > n_chosen
        left_out = [str(i) for i in np.flatnonzero(longer)] if not model.encoder else []
        assert len(said) == (1 if left_out else 0), f"{mode}: one warning per call"
        if said:
            assert f"ids: {', '.join(left_out)})" in str(said[0].message)
        if estimand == "direct" and left_out:  # path-frozen: nothing patched at the read token, no effect
            np.testing.assert_allclose(got.effect[np.flatnonzero(longer)], 0.0, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
def test_prefix_heads_match_the_reference(tiny_root, pairs, arch):
    model = rl.load(str(tiny_root[arch]))
    got, _ = _patch(model, pairs, mode="noising", level="head")
    want_c, _ = _reference(model, pairs, mode="noising", level="head")
    np.testing.assert_allclose(got.patched_chosen, want_c, atol=2e-5, rtol=1e-5)


def test_prefix_equals_all_on_token_aligned_pairs(tiny_root, tokenizer):
    pair = Pair("Say a number.", "The number is 7.", "The number is 9.")
    sides = [tokenize(tokenizer, pair.conversation(s), encoder=False).ids for s in ("chosen", "rejected")]
    assert len(sides[0]) == len(sides[1])
    model = rl.load(str(tiny_root["qwen2"]))
    got, said = _patch(model, [pair], mode="denoising")
    want = patch(model, [pair], mode="denoising", positions="all", batch_size=2)
    np.testing.assert_allclose(got.patched_rejected, want.patched_rejected, atol=1e-6)
    assert not said


def test_the_warning_names_pair_ids_and_attribution_patching_takes_prefix(tiny_root, pairs):
    from rewardlens.causal import attribution_patch

    model = rl.load(str(tiny_root["llama"]))
    named = [Pair(p.prompt, p.chosen, p.rejected, id=f"item-{i}") for i, p in enumerate(pairs)]
    n_chosen, n_rejected = _lengths(model, named)
    _, said = _patch(model, named)
    assert len(said) == 1
    assert all((f"item-{i}" in str(said[0].message)) == (n_chosen[i] > n_rejected[i]) for i in range(len(named)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RewardLensWarning)
        atp = attribution_patch(model, named, positions="prefix")
    assert atp.positions == "prefix" and np.isfinite(atp.effect).all()


def test_the_command_line_takes_prefix(capsys, tiny_root, tmp_path, pairs):
    import json

    from rewardlens.cli import main
    from rewardlens.cli.causal import positions
    from rewardlens.data import save_pairs

    assert positions("prefix") == "prefix"
    path = str(tiny_root["llama"])
    file = str(save_pairs(pairs, tmp_path / "pairs.jsonl"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RewardLensWarning)
        assert main(["patch", path, "--pairs", file, "--positions", "prefix", "--json", "--all-parts"]) == 0
        want = patch(rl.load(path), pairs, positions="prefix")
    out = json.loads(capsys.readouterr().out)
    effects = out["pairs"][0]["effects"]
    assert effects["mlp_L0"] == pytest.approx(float(want.effect[0, want.names.index("mlp_L0")]), abs=1e-6)


# Where the suffix engine must decline, and why (the stepped engine then runs whole sequences).
DECLINES = {"bert": "attends both ways", "deberta-v2": "attends both ways", "roberta": "attends both ways",
            "xlm-roberta": "attends both ways", "armorm": "a gate read at its own position",
            "gemma3-mm": "sliding window (8 tokens)"}


@pytest.mark.parametrize("arch", ARCHS)
def test_runs_compute_only_what_the_patch_changes_and_equal_the_full_runs(tiny_root, pairs, arch):
    """On a causal decoder the two sides share their prompt, so the suffix engine computes only positions
    from the first that a patch changes (on the clean run's cache); forced, its patched rewards equal the
    stepped engine's (whole sequences) and the reference, in noising and denoising. Where it must decline
    (`DECLINES`, and ablation, which changes every position) the result says why, and forcing it is refused."""
    from rewardlens.errors import UsageError

    model = rl.load(str(tiny_root[arch]))
    seqs, _ = model.encode(pairs)
    shared = [next(k for k, (a, b) in enumerate(zip(seqs[i].ids, seqs[i + 1].ids)) if a != b)
              for i in range(0, len(seqs), 2)]
    assert min(shared) > 5, "the pairs must share a prompt prefix, or the engine has nothing to skip"
    for mode in ("noising", "denoising", "ablation"):
        default, _ = _patch(model, pairs, mode=mode)
        assert default.provenance is not None
        if mode == "ablation" or arch in DECLINES:
            why = default.provenance.reason("suffix_sweep")
            assert why is not None and (DECLINES.get(arch, "ablation") in why or "ablation" in why), why
            with pytest.raises(UsageError, match="engine='suffix_sweep' cannot run"):
                _patch(model, pairs, mode=mode, engine="suffix_sweep")
            continue
        got, _ = _patch(model, pairs, mode=mode, engine="suffix_sweep")
        assert got.provenance is not None and got.provenance.engine == "suffix_sweep" and got.provenance.proof
        want_c, want_r = _reference(model, pairs, mode=mode)
        np.testing.assert_allclose(got.patched_chosen, want_c, atol=2e-5, rtol=1e-5, err_msg=mode)
        np.testing.assert_allclose(got.patched_rejected, want_r, atol=2e-5, rtol=1e-5, err_msg=mode)
        stepped, _ = _patch(model, pairs, mode=mode, engine="stepped_sweep")
        np.testing.assert_allclose(got.patched_chosen, stepped.patched_chosen, atol=2e-5, rtol=1e-5)
