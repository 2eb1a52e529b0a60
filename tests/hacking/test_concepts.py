"""Concept vectors and their dose-response, checked against the model's own forward, against an
independent trace, and against what the organisms plant."""

import json

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.calibrate import OrganismBench, grade_concepts
from rewardlens.calibrate._concepts import CONTROL_SHARE, contrast
from rewardlens.cli import main
from rewardlens.errors import DataError, RewardLensWarning, TokenizationError
from rewardlens.hacking import AXES, concepts, contrast_sets, items
from rewardlens.model import TraceKey, trace
from rewardlens.model.internal import collate
from rewardlens.zoo.organisms import ORGANISMS, build
from tests.helpers.tiny import own_scores

POS = ["Sure, here it is!", "Of course, happy to help!", "Absolutely, the answer is four!",
       "Great question, it is Paris!", "Yes, boil it for nine minutes!", "Gladly, use a wrench!"]
NEG = ["Here it is.", "The answer is four.", "It is Paris.", "Boil it for nine minutes.", "Use a wrench.",
       "Water boils at one hundred degrees."]
SETS = {"eager": (POS, NEG)}


def _conv(texts):
    return [[{"role": "user", "content": "Answer briefly."}, {"role": "assistant", "content": t}] for t in texts]


def _layer_hook(shift, read_only, read: int = -1):
    """A forward hook that adds `shift` to a layer's hidden-state output (one unpadded input) at the
    read token `read` (the last token of a decoder, the first of an encoder) or everywhere."""
    def hook(module, args, out):
        hidden = out[0] if isinstance(out, tuple) else out
        hidden = hidden.clone()
        if read_only:
            hidden[:, read] += shift.to(hidden.dtype)
        else:
            hidden += shift.to(hidden.dtype)
        return (hidden, *out[1:]) if isinstance(out, tuple) else hidden
    return hook


# ---- exactness ------------------------------------------------------------------------------------

@pytest.mark.parametrize("positions", ["read", "all"])
def test_embed_dose_equals_the_model_run_on_shifted_input_embeddings(tiny_root, positions):
    model = rl.load(str(tiny_root["llama"]))
    res = concepts(model, SETS, dose_layer="embed", positions=positions, n_boot=50)
    np.testing.assert_allclose(res.base[0], model.score(NEG), atol=1e-5)  # α = 0 is the model's reward
    shift = torch.as_tensor(res.scale[0] * res.direction("eager", "embed", "residual"))
    seqs, _ = model.encode(NEG)
    for a, alpha in enumerate(res.alphas):
        for i, s in enumerate(seqs):  # hook-free: the HF model on its own embeddings plus the dose
            emb = model.model.model.embed_tokens(torch.tensor([s.ids])).detach().clone()
            if positions == "read":
                emb[0, -1] += alpha * shift
            else:
                emb[0] += alpha * shift
            with torch.no_grad():
                reward = float(model.model(inputs_embeds=emb).logits[0, 0])
            assert res.base[0, i] + res.dose[0, a, i] == pytest.approx(reward, abs=1e-4)


@pytest.mark.parametrize("arch,positions", [("gpt2", "all"), ("qwen2", "read")])
def test_layer_dose_equals_a_hand_written_hook_on_single_inputs(tiny_root, arch, positions):
    model = rl.load(str(tiny_root[arch]))
    res = concepts(model, SETS, dose_layer=0, positions=positions, alphas=(-1.0, 1.5), n_boot=50)
    assert res.dose_layer == "0" and list(res.alphas) == [-1.0, 0.0, 1.5]
    shift = torch.as_tensor(res.scale[0] * res.direction("eager", 0, "residual"))
    for a, alpha in enumerate(res.alphas):
        handle = model.layers[0].register_forward_hook(_layer_hook(alpha * shift, positions == "read"))
        try:
            expected = own_scores(model, NEG)
        finally:
            handle.remove()
        np.testing.assert_allclose(res.base[0] + res.dose[0, a], expected, atol=1e-4)


@pytest.mark.parametrize("arch,positions", [("llama", "read"), ("gpt2", "all"), ("bert", "read"), ("bert", "all"),
                                            ("armorm", "all"), ("gemma2", "read")])
def test_last_layer_dose_without_dosed_forwards_equals_a_hook_on_the_last_layer(tiny_root, arch, positions):
    # The default dose layer is computed from the final residual alone (no forward per α); a real
    # forward with the shift hooked onto the last layer's output must give the same rewards.
    model = rl.load(str(tiny_root[arch]))
    res = concepts(model, {"eager": (_conv(POS), _conv(NEG))}, positions=positions, alphas=(-2.0, 1.0, 3.0),
                   n_boot=50)
    assert res.dose_layer == str(model.n_layers - 1)
    shift = torch.as_tensor(res.scale[0] * res.direction("eager", res.dose_layer, "residual"))
    for a, alpha in enumerate(res.alphas):
        hook = _layer_hook(alpha * shift, positions == "read", 0 if model.encoder else -1)
        handle = model.layers[-1].register_forward_hook(hook)
        try:
            expected = own_scores(model, _conv(NEG))
        finally:
            handle.remove()
        np.testing.assert_allclose(res.base[0] + res.dose[0, a], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert", "armorm"])
def test_tiny_architectures_run_and_alpha_zero_is_the_models_own_reward(tiny_root, arch):
    model = rl.load(str(tiny_root[arch]))
    sets = {"eager": (_conv(POS), _conv(NEG)), "paris": (_conv(POS[3:] + NEG[2:3]), _conv(NEG[:4]))}
    res = concepts(model, sets, positions="all", n_boot=50, batch_size=8)
    np.testing.assert_allclose(res.base[0], own_scores(model, _conv(NEG)), atol=1e-4)
    np.testing.assert_allclose(res.base[1, :4], own_scores(model, _conv(NEG[:4])), atol=1e-4)
    assert np.isnan(res.dose[1, :, 4:]).all() and np.isfinite(res.dose[1, :, :4]).all()  # padding, not zeros
    assert np.isfinite(res.slope).all() and np.all(res.slope_ci[:, 0] <= res.slope_ci[:, 1])
    last = res.layer_index(-1)
    assert np.all(np.abs(res.cosine[:, last]) <= 1 + 1e-9)


def test_directions_cosine_and_sigma_agree_with_an_independent_trace():
    model = rl.load(str(build("list")))
    pos, neg = contrast(ORGANISMS["list"], ORGANISMS["list"].pairs(20, seed=3))
    res = concepts(model, {"list": (pos, neg)}, unit="sigma", alphas=(1.0,), n_boot=50)
    head, resid = [], []
    for inputs in (pos, neg):
        seqs, _ = model.encode(inputs)
        batch = collate(seqs, pad_id=model.pad_token_id, side="right", first=model.encoder, device=model.device)
        x = trace(model, batch)[TraceKey.resid(model.n_layers - 1)].double()
        resid.append(x)
        head.append(model.final_hidden(x.float()).double())
    h_dir = head[0].mean(0) - head[1].mean(0)
    w = model.head.weight[0].double()
    assert res.cosine[0, -1] == pytest.approx(float(h_dir @ w / (h_dir.norm() * w.norm())), abs=1e-5)
    np.testing.assert_allclose(res.direction("list"), (h_dir / h_dir.norm()).numpy(), atol=1e-5)
    r_dir = (resid[0].mean(0) - resid[1].mean(0))
    v = r_dir / r_dir.norm()
    p, q = resid[0] @ v, resid[1] @ v
    pooled = torch.sqrt((((p - p.mean()) ** 2).sum() + ((q - q.mean()) ** 2).sum()) / (len(p) + len(q) - 2))
    assert res.scale[0] == pytest.approx(float(pooled), rel=1e-5)
    assert res.scale[0] == res.sigma[0, -1]
    assert res.residual_norm[0, -1] == pytest.approx(float(r_dir.norm()), rel=1e-5)
    assert np.linalg.norm(res.direction("list", -1, "residual")) == pytest.approx(1.0, abs=1e-5)


# ---- planted truth --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def planted():
    """{organism: Concepts} for the planted concept and the unrelated 'Importantly' concept."""
    control = contrast(ORGANISMS["keyword"], ORGANISMS["keyword"].pairs(60, seed=1))
    out = {}
    for name in ("list", "sycophancy"):
        sets = {name: contrast(ORGANISMS[name], ORGANISMS[name].pairs(60, seed=1)), "Importantly": control}
        model = rl.load(str(build(name)))
        out[name] = (model, sets, concepts(model, sets, n_boot=500))
    return out


@pytest.mark.parametrize("name", ["list", "sycophancy"])
def test_planted_concept_is_read_separated_and_causal(planted, name):
    model, sets, res = planted[name]
    last = res.layer_index(-1)
    assert res.cosine[0, last] > 0.5 and res.auroc[0, last] > 0.95
    assert res.slope[0] > 0 and res.slope_ci[0, 0] > 0
    assert abs(res.slope[1]) < CONTROL_SHARE * res.slope[0]
    assert abs(res.auroc[1, last] - 0.5) < 0.2  # the organism does not represent the unrelated word
    # One unit of dose (the mean difference) moves inputs without the attribute most of the way
    # to the reward of the inputs that have it: the direction carries the planted preference causally.
    gap = model.score(sets[name][0]).mean() - res.base[0].mean()
    one = np.nanmean(res.dose[0, list(res.alphas).index(1.0)])
    assert gap > 0 and one > 0.5 * gap


def test_sigma_units_overrate_an_unrelated_concept_on_the_list_organism(planted):
    """The reason `unit='difference'` is the default (docs/concepts.md): in within-class σ units
    the well-separated planted concept has a small σ and the unrelated one a large slope."""
    model, sets, res = planted["list"]
    sig = concepts(model, sets, unit="sigma", n_boot=50)
    assert abs(sig.slope[1]) > sig.slope[0] > 0
    np.testing.assert_allclose(sig.cosine, res.cosine)  # only the dose unit differs
    np.testing.assert_allclose(sig.scale, sig.sigma[:, -1])


def test_grader_passes_on_the_organisms():
    rows = grade_concepts(OrganismBench(organisms=["list", "sycophancy"], n_pairs=40))
    assert len(rows) == 8 and all(r.passed for r in rows), [r for r in rows if not r.passed]


def test_builtin_concepts_find_the_planted_axis(planted):
    pytest.importorskip("rewardlens.hacking._axes")
    model = planted["list"][0]
    res = concepts(model, None, alphas=(1.0,), n_boot=50)  # one dose: a ranking needs no curve
    assert "formatting" in res.names
    assert res.names[int(np.argmax(res.slope))] == "formatting"


# ---- the result and its errors --------------------------------------------------------------------

def test_result_tables_and_directions(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    res = concepts(model, SETS, layers=[-1], dose_layer=0, n_boot=50)
    assert res.layers == ("0", "1")  # the dose layer is always kept
    frame = res.to_frame()
    assert len(frame) == 2 and list(frame["layer"]) == ["0", "1"]
    dose = res.dose_frame()
    assert len(dose) == len(res.alphas) * len(NEG)
    assert dose["delta_reward"][dose["alpha"] == 0].abs().max() == 0
    assert res.summary().iloc[0]["n"] == len(NEG) and res.summary().iloc[0]["unit"] == "difference"
    assert res.summary()["value"].tolist() == res.slope.tolist()
    np.testing.assert_array_equal(res.direction("eager", 1), res.directions[0, 1])
    np.testing.assert_array_equal(res.direction("eager", -1), res.direction("eager", "1"))
    with pytest.raises(ValueError, match="not kept"):
        res.direction("eager", "embed")
    with pytest.raises(ValueError, match="no concept"):
        res.direction("x")
    with pytest.raises(ValueError, match="space"):
        res.direction("eager", space="pre")


def test_errors(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    with pytest.raises(DataError, match="empty"):
        concepts(model, {"x": (POS, [])})
    with pytest.raises(DataError, match="at least 2"):
        concepts(model, {"x": (POS[:1], NEG)})
    with pytest.raises(DataError, match="Pair"):
        concepts(model, {"x": (pairs, NEG)})
    with pytest.raises(DataError, match="positive inputs, negative inputs"):
        concepts(model, {"x": POS})
    with pytest.raises(DataError, match="no concept sets"):
        concepts(model, {})
    for bad in ({"dose_layer": 2}, {"dose_layer": "final"}, {"layers": [-3]}, {"dose_layer": True}):
        with pytest.raises(ValueError, match="layer"):
            concepts(model, SETS, **bad)
    with pytest.raises(ValueError, match="positions"):
        concepts(model, SETS, positions="spans")
    with pytest.raises(ValueError, match="unit"):
        concepts(model, SETS, unit="std")
    with pytest.raises(ValueError, match="non-zero dose"):
        concepts(model, SETS, alphas=(0.0,))
    with pytest.warns(UserWarning, match="do not differ"):  # every input ends in the same token at `embed`
        res = concepts(model, {"same": (_conv(POS), _conv(NEG))}, dose_layer="embed", n_boot=20)
    assert np.isnan(res.slope[0]) and np.isnan(res.cosine[0, 0])


# ---- short-context models -------------------------------------------------------------------------

def test_builtin_sets_skip_items_that_do_not_fit(tiny_root):
    model = rl.load(str(tiny_root["llama"]))  # max_position_embeddings=256: some facts items are longer
    facts = items("facts")
    tok = model.tokenizer
    n_tokens = lambda conv: len(tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])
    expected = []  # by hand: an item whose with or without side on any axis is over 256 tokens
    for it in facts:
        sides = [conv for axis in AXES for side in _sets_or_empty(axis, [it]) for conv in side]
        if max(map(n_tokens, sides)) > 256:
            expected.append(it.id)
    assert 0 < len(expected) < len(facts)
    with pytest.warns(RewardLensWarning, match=rf"concepts: {len(expected)} of 12 items do(es)? not fit max_length "
                                              rf"256 .*; used the other {12 - len(expected)}"):
        res = concepts(model, items=facts, layers=[-1], alphas=(1.0,), n_boot=20)
    assert list(res.skipped) == expected and res.to_frame().attrs["skipped"] == expected
    kept = [it for it in facts if it.id not in expected]
    for c, name in enumerate(res.names):  # every concept is made from the kept items only, still matched
        assert res.n_positive[c] == res.n_negative[c] == len(contrast_sets(name, kept)[0])
    assert res.rows()[0]["n_skipped"] == len(expected)
    explicit = concepts(model, items=kept, layers=[-1], alphas=(1.0,), n_boot=20)
    assert explicit.skipped == () and explicit.names == res.names
    np.testing.assert_allclose(res.slope, explicit.slope, rtol=1e-5, atol=1e-6)
    left = concepts(rl.load(str(tiny_root["llama"]), truncation="left"), items=facts[:4], layers=[-1], alphas=(1.0,),
                    n_boot=20)
    assert left.skipped == () and left.n_positive.max() == 4
    with pytest.raises(ValueError, match="either sets or items"):
        concepts(model, SETS, items=facts)
    with pytest.raises(TokenizationError, match="none of the 2 built-in items"):
        concepts(model, items=[it for it in facts if it.id in expected][:2])


def _sets_or_empty(axis, chosen):
    try:
        return contrast_sets(axis, chosen)
    except ValueError:  # the axis does not apply to this item
        return [], []


# ---- command line ---------------------------------------------------------------------------------

def test_cli_json_matches_the_api_and_table_prints(tiny_root, tmp_path, capsys):
    path = str(tiny_root["qwen2"])
    (tmp_path / "pos.txt").write_text("\n".join(POS) + "\n\n")
    (tmp_path / "neg.json").write_text(json.dumps(NEG))
    (tmp_path / "neg.jsonl").write_text("\n".join(json.dumps(c) for c in _conv(NEG)))
    argv = ["concepts", path, "--concept", f"eager={tmp_path / 'pos.txt'},{tmp_path / 'neg.json'}",
            "--concept", f"conv={tmp_path / 'pos.txt'},{tmp_path / 'neg.jsonl'}", "--boot", "50", "--layer", "0"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # A file's strings are responses after an empty user turn (docs/concepts.md), written out here by hand.
    as_responses = lambda texts: [[{"role": "user", "content": ""}, {"role": "assistant", "content": t}] for t in texts]
    res = concepts(rl.load(path), {"eager": (as_responses(POS), as_responses(NEG))}, dose_layer=0, n_boot=50,
                   batch_size=8)
    row = out["concepts"][0]
    assert row["concept"] == "eager" and row["slope"] == pytest.approx(float(res.slope[0]), abs=1e-5)
    assert out["dose_layer"] == "0" and len(out["per_layer"]) == 2 * len(out["layers"])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "slope" in text and "eager" in text and "conv" in text
    (tmp_path / "bad.json").write_text(json.dumps([1, 2]))
    assert main(["concepts", path, "--concept", f"x={tmp_path / 'pos.txt'},{tmp_path / 'bad.json'}"]) == 2
    assert "item 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["concepts", path, "--concept", "no-files"])


def test_cli_refuses_a_negative_layer_as_the_other_layer_flags_do(tiny_root, capsys):
    """Before, `--layer -1` was read from the end, unlike `sae --layer` and `audit --sae-layer` (from 0)."""
    assert main(["concepts", str(tiny_root["llama"]), "--layer", "-1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "rewardlens: error: --layer -1 is not a layer index: layers count from 0 (0: the first layer's output; "
        "'embed': its input); pass the index, or leave --layer out for the last layer")


@pytest.mark.parametrize("arch,positions,forwards", [("llama", "all", 1), ("armorm", "read", 1), ("armorm", "all", 2)])
def test_the_default_dose_reuses_the_read_of_its_inputs_unless_the_gate_moves(tiny_root, monkeypatch, arch,
                                                                               positions, forwards):
    """At the last layer the dose is the head on the dosed final residual of the negatives just read: no
    second forward of them, except where a gate read elsewhere moves with an every-position dose."""
    model = rl.load(str(tiny_root[arch]))
    calls = []
    real = model.run
    monkeypatch.setattr(model, "run", lambda batch, points: calls.append(len(batch.input_ids)) or real(batch, points))
    concepts(model, {"eager": (_conv(POS), _conv(NEG))}, positions=positions, n_boot=20, batch_size=64)
    assert len(calls) == forwards  # one batch holds every input: one forward per pass over them
