"""`TraceKey`, the one owner of trace keys: names and parsing invert each other, bad keys are refused
with the fix, and a trace is keyed by exactly the keys its layers should have."""

import dataclasses
import re

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.model import TraceKey, trace
from rewardlens.model.internal import TRACE_KINDS, collate, projection_inputs
from tests.helpers.tiny import PAIRS

# Every constructor and the string form it must have (today's strings, which stored caches and SAE folders hold).
NAMED = {
    TraceKey.embed(): "embed",
    TraceKey.final(): "final",
    TraceKey.gate(): "gate",
    TraceKey.resid(3): "resid_3",
    TraceKey.attn(0): "attn_0",
    TraceKey.mlp(11): "mlp_11",
    TraceKey.attn_z(0): "attn_z_0",
    TraceKey.mlp_act(12): "mlp_act_12",
    TraceKey.attn_rnorm(1): "attn_rnorm_1",
    TraceKey.mlp_rnorm(10): "mlp_rnorm_10",
}


def test_every_kind_has_its_name_and_parses_back():
    assert {key.kind for key in NAMED} == set(TRACE_KINDS)  # a new kind needs a line above
    for key, name in NAMED.items():
        assert key.name == str(key) == name
        parsed = TraceKey.parse(name)
        assert parsed == key and hash(parsed) == hash(key) and type(parsed.layer) is type(key.layer)


@pytest.mark.parametrize("layer", [0, 1, 9, 10, 123])
def test_layered_kinds_round_trip_at_any_layer(layer):
    for kind in TRACE_KINDS:
        if kind in ("embed", "final", "gate"):
            continue
        key = TraceKey(kind, layer)
        assert key.name == f"{kind}_{layer}" and TraceKey.parse(key.name) == key


@pytest.mark.parametrize("bad", [
    "", "resid", "resid_", "resid_-1", "resid_03", "resid_3 ", " resid_3", "Resid_3", "resid3", "attn_z",
    "attn_z_x", "mlp_L3", "attn_L0_H1", "final_0", "embed_0", "gate_1", "layers.3", "rnorm_1", "attn_rnorm",
])
def test_parse_refuses_a_bad_string_naming_it_and_the_valid_forms(bad):
    with pytest.raises(ValueError, match=re.escape(repr(bad))) as err:
        TraceKey.parse(bad)
    assert "'resid_<l>'" in str(err.value) and "'embed'" in str(err.value) and "'attn_z_<l>'" in str(err.value)


def test_parse_refuses_what_is_not_a_string():
    with pytest.raises(TypeError, match="string"):
        TraceKey.parse(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="string"):
        TraceKey.parse(TraceKey.resid(3))  # type: ignore[arg-type]


def test_validation_names_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"'resid' needs a layer .* got None.*TraceKey\.resid\(0\)"):
        TraceKey("resid")
    with pytest.raises(ValueError, match=r"'embed' .* has no layer, got layer=0.*TraceKey\.embed\(\)"):
        TraceKey("embed", 0)
    with pytest.raises(ValueError, match=r"'final' .* has no layer, got layer=2"):
        TraceKey("final", 2)
    with pytest.raises(ValueError, match=r">= 0 .* got -1"):
        TraceKey.resid(-1)
    for bad in (1.0, "3", True):
        with pytest.raises(ValueError, match=re.escape(f"got {bad!r}")):
            TraceKey("attn", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"kind must be one of .* got 'resid_3'"):
        TraceKey("resid_3", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'attn' or 'mlp'"):
        TraceKey.sublayer("embed", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth is >= 0"):
        TraceKey.at_depth(-1)


def test_keys_are_values():
    key = TraceKey.resid(3)
    assert key == TraceKey("resid", 3) and {key: 1}[TraceKey.parse("resid_3")] == 1
    assert key != TraceKey.attn(3) and key != TraceKey.resid(2) and TraceKey.attn(0) != TraceKey.attn_z(0)
    assert key != "resid_3"  # the string form is the boundary's, never a key
    numpy_layer = TraceKey.resid(np.int64(3))  # type: ignore[arg-type]
    assert numpy_layer == key and hash(numpy_layer) == hash(key) and type(numpy_layer.layer) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.layer = 4  # type: ignore[misc]


def test_sublayer_and_depth_helpers():
    assert TraceKey.sublayer("attn", 2) == TraceKey.attn(2) and TraceKey.sublayer("mlp", 2) == TraceKey.mlp(2)
    assert TraceKey.at_depth(0) == TraceKey.embed() and TraceKey.at_depth(3) == TraceKey.resid(2)


def _traced(model, **kwargs):
    seqs, _ = model.encode(PAIRS[:2])
    batch = collate(seqs, pad_id=model.pad_token_id, side="right", first=model.encoder, device=model.device)
    return trace(model, batch, **kwargs)


def _expected(n_layers: int, heads=(), neurons=(), rnorm=False, gate=False) -> set[TraceKey]:
    keys = {TraceKey.embed(), TraceKey.final()} | ({TraceKey.gate()} if gate else set())
    for layer in range(n_layers):
        keys |= {TraceKey.resid(layer), TraceKey.attn(layer), TraceKey.mlp(layer)}
        keys |= {TraceKey.attn_rnorm(layer), TraceKey.mlp_rnorm(layer)} if rnorm else set()
    return keys | {TraceKey.attn_z(layer) for layer in heads} | {TraceKey.mlp_act(layer) for layer in neurons}


@pytest.mark.parametrize("arch,rnorm,gate", [("llama", False, False), ("bert", True, False), ("armorm", False, True)])
def test_a_trace_is_keyed_by_exactly_its_layers_keys(tiny_root, arch, rnorm, gate):
    model = rl.load(str(tiny_root[arch]))
    assert model.n_layers >= 2 and (model.arch.layout == "post_norm") == rnorm
    tr = _traced(model)
    assert set(tr.captured) == _expected(model.n_layers, rnorm=rnorm, gate=gate)
    assert all(isinstance(key, TraceKey) for key in tr.captured)
    tr = _traced(model, heads=[0], neurons=[1])
    assert set(tr.captured) == _expected(model.n_layers, heads=[0], neurons=[1], rnorm=rnorm, gate=gate)
    assert tr[TraceKey.attn_z(0)].shape == (4, projection_inputs(model, "attn", 0)[0])
    assert tr[TraceKey.mlp_act(1)].shape == (4, projection_inputs(model, "mlp", 1)[0])
    if gate:
        assert TraceKey.gate() not in _traced(model, gate=False).captured


def test_a_trace_refuses_a_string_key_and_says_how_to_cross_the_boundary(tiny_root):
    tr = _traced(rl.load(str(tiny_root["llama"])))
    with pytest.raises(TypeError, match=re.escape("TraceKey.parse('resid_0')")):
        tr["resid_0"]  # type: ignore[index]
    assert tr[TraceKey.parse("resid_0")] is tr.captured[TraceKey.resid(0)]


def test_every_patch_site_names_a_key_of_the_trace(tiny_root):
    from rewardlens.causal._engine import sites

    model = rl.load(str(tiny_root["llama"]))
    keys = set(_traced(model, heads=range(model.n_layers)).captured)
    for level in ("sublayer", "head"):
        assert {site.key for site in sites(model, level)} <= keys
    assert {s.key for s in sites(model, "head") if s.head is not None} == {TraceKey.attn_z(layer)
                                                                           for layer in range(model.n_layers)}
