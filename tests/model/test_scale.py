"""Big models: `device_map` loads split by accelerate, with layers offloaded to disk, in fp32 and bf16.

This machine has no GPU, so "larger than one device" is simulated the way accelerate does it on a
CPU: layers that do not fit are offloaded to disk (their weights sit on the meta device and
accelerate's hooks load them for each forward). Every instrument must read real activations through
those hooks and real head/norm/projection weights outside the forward, and give the numbers of the
same model loaded plainly.
"""

import numpy as np
import pytest
import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForSequenceClassification

import rewardlens as rl
from rewardlens.model._load import _accelerators
from rewardlens.model.internal import find_map, get_module
from tests.helpers.tiny import PAIRS, own_scores

ARCHS = ["llama", "gpt2", "bert"]
PLACEMENTS = ["split", "auto"]


def _empty(folder):
    with init_empty_weights():
        return AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(folder))


def split_map(folder) -> dict[str, str]:
    """An explicit device_map: embeddings and odd layers on 'cpu'; even layers, the final norm,
    the pooler and the head on 'disk', so the last layers sit elsewhere than the embeddings."""
    model = _empty(folder)
    arch = find_map(model)
    on_disk = {p for p in (arch.final_norm, arch.head, arch.pooler) if p}
    placement: dict[str, str] = {}

    def walk(prefix, module):
        for name, child in module.named_children():
            path = prefix + name
            if path == arch.layers:
                placement.update({f"{path}.{i}": "disk" if i % 2 == 0 else "cpu" for i in range(len(child))})
            elif any(p.startswith(path + ".") for p in (arch.layers, *on_disk)):
                walk(path + ".", child)
            else:
                placement[path] = "disk" if path in on_disk else "cpu"

    walk("", model)
    return placement


def load_offloaded(folder, tmp_path, placement, dtype=None):
    """`rl.load` with layers offloaded to disk: by an explicit map, or by device_map='auto' with a
    CPU budget of 85% of the model (accelerate keeps room for its largest module, here the
    embeddings, and offloads what does not fit: the later layers and the head)."""
    if placement == "split":
        kwargs = {"device_map": split_map(folder)}
    else:
        size = sum(p.numel() for p in _empty(folder).parameters()) * (2 if dtype == "bfloat16" else 4)
        kwargs = {"device_map": "auto", "max_memory": {"cpu": int(0.85 * size)}}
    model = rl.load(str(folder), dtype=dtype, offload_folder=str(tmp_path / "offload"), **kwargs)
    # The simulation must really split the model: some weights on disk, some on the CPU.
    assert set(model.model.hf_device_map.values()) == {"cpu", "disk"}, model.model.hf_device_map
    assert any(p.is_meta for p in model.model.parameters())
    return model


def hook_state(module: torch.nn.Module) -> dict:
    """Per submodule: torch hooks (rewardlens' kind), accelerate's hook type, and which of its own
    weights are offloaded (on meta)."""
    return {
        name: (dict(m._forward_hooks), dict(m._forward_pre_hooks), type(getattr(m, "_hf_hook", None)).__name__,
               sorted(n for n, p in m.named_parameters(recurse=False) if p.is_meta))
        for name, m in module.named_modules()
    }


def _close(actual, expected, rtol=1e-5):
    actual, expected = np.asarray(actual), np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("arch", ARCHS)
def test_offloaded_model_gives_the_plain_models_numbers(tiny_root, tmp_path, arch, placement):
    model = load_offloaded(tiny_root[arch], tmp_path, placement)
    plain = rl.load(str(tiny_root[arch]))
    before = hook_state(model.model)
    if placement == "split":  # the head itself was offloaded, yet its rows are real and fp32
        assert get_module(model.model, model.arch.head).weight.is_meta
    torch.testing.assert_close(model.head.weight, plain.head.weight, rtol=0, atol=0)

    score = model.score(PAIRS)
    _close(score, own_scores(model, PAIRS))
    _close(score, plain.score(PAIRS))

    for level in ("sublayer", "head", "neuron"):
        attr, ref = rl.attribute(model, PAIRS, level=level), rl.attribute(plain, PAIRS, level=level)
        assert attr.names == ref.names
        _close(attr.values.sum(1) + attr.constant, attr.reward)
        _close(attr.reward, score)
        _close(attr.values, ref.values)
        # Head and neuron levels read projection weights outside any forward: offloaded again now.
        assert hook_state(model.model) == before

    lens = rl.lens(model, PAIRS)
    _close(lens.linear[:, -1], lens.reward)
    _close(lens.normed[:, -1], lens.reward)
    _close(lens.linear, rl.lens(plain, PAIRS).linear)

    for kwargs in ({}, {"level": "head", "estimand": "direct"}, {"mode": "denoising"}):
        got, want = rl.patch(model, PAIRS, **kwargs), rl.patch(plain, PAIRS, **kwargs)
        assert got.names == want.names
        _close(got.effect, want.effect)
        _close(got.margin, score[0::2] - score[1::2])
    # One backward pass through accelerate's hooks (weights loaded on the fly keep their gradients).
    _close(rl.causal.attribution_patch(model, PAIRS).effect, rl.causal.attribution_patch(plain, PAIRS).effect)

    # Nothing of ours is left: no torch hooks, accelerate's hooks as they were, and every weight
    # that was offloaded is offloaded again (not left materialised in memory).
    after = hook_state(model.model)
    assert after == before
    assert all(not fwd and not pre for fwd, pre, _, _ in after.values())


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_offloaded_keeps_the_head_fp32_and_closes(tiny_root, tmp_path, arch):
    model = load_offloaded(tiny_root[arch], tmp_path, "split", dtype="bfloat16")
    plain32 = rl.load(str(tiny_root[arch]))
    plain16 = rl.load(str(tiny_root[arch]), dtype="bfloat16")
    assert next(model.model.parameters()).dtype == torch.bfloat16
    head = model.head
    kept = [head.weight, head.bias] + ([head.pooler_weight, head.pooler_bias] if head.pooler_weight is not None else [])
    assert all(t.dtype == torch.float32 and not t.is_meta for t in kept)
    # The kept rows are the model's own bf16 weights read back from disk, upcast without loss.
    torch.testing.assert_close(head.weight, plain32.head.weight.to(torch.bfloat16).float(), rtol=0, atol=0)

    score = model.score(PAIRS)
    scale = float(np.abs(score).max())
    # Same bf16 weights, same kernels: the split model scores as the unsplit bf16 model does.
    _close(score, plain16.score(PAIRS))
    # The model's own bf16 head rounds its output; ours does not. Both within bf16 of fp32.
    np.testing.assert_allclose(score, own_scores(model, PAIRS), atol=2e-2 * scale)
    np.testing.assert_allclose(score, plain32.score(PAIRS), atol=5e-2 * scale)

    attr = rl.attribute(model, PAIRS, level="head")
    assert all(n.gamma.dtype == torch.float32 for n in model._norms.values())
    _close(attr.reward, score)
    # Parts are captured from a bf16 residual stream, whose own additions round: closure holds to
    # bf16 precision of the parts' size (a missing part would be off by that part, O(1)).
    bound = 2.0**-6 * np.abs(attr.values).sum(1)
    assert (np.abs(attr.residual_error) <= bound).all(), (attr.residual_error, bound)
    _close(attr.values, rl.attribute(plain16, PAIRS, level="head").values)
    lens = rl.lens(model, PAIRS)
    _close(lens.normed[:, -1], score)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_gated_head_offloaded_keeps_a_real_fp32_gate(tiny_root, tmp_path, dtype):
    folder = tiny_root["armorm"]
    device_map = {"model": "cpu", "regression_layer": "disk", "gating": "disk", "reward_transform_matrix": "cpu"}
    with pytest.warns(UserWarning, match="reward_transform_matrix"):  # accelerate: a parameter, not a module
        model = rl.load(str(folder), dtype=dtype, device_map=device_map, offload_folder=str(tmp_path / "offload"))
    plain = rl.load(str(folder), dtype=dtype)
    assert get_module(model.model, "gating.layers.0").weight.is_meta
    convs = [[{"role": "user", "content": "Is it hot?"}, {"role": "assistant", "content": a}]
             for a in ("It is hot.", "No idea, sorry.", "Yes: 31 degrees today.")]
    score = model.score(convs)
    _close(score, plain.score(convs))
    scale = float(np.abs(score).max())
    np.testing.assert_allclose(score, own_scores(model, convs), atol=(2e-2 if dtype else 1e-5) * scale)
    attr = rl.attribute(model, convs)
    bound = (2.0**-6 if dtype else 1e-5) * np.abs(attr.values).sum(1)
    assert (np.abs(attr.residual_error) <= bound).all(), (attr.residual_error, bound)
    # The gate copy is ours: fp32 weights that stay real, no accelerate hook that would swap the
    # original (offloaded, here possibly bf16) weights back in on every call.
    gate = model.head.gating
    assert all(p.dtype == torch.float32 and not p.is_meta for p in gate.parameters())
    assert not any(hasattr(m, "_hf_hook") for m in gate.modules())
    assert hasattr(get_module(model.model, "gating.layers.0"), "_hf_hook")  # the user's model keeps its own


def test_all_on_disk(tiny_root, tmp_path):
    model = rl.load(str(tiny_root["llama"]), device_map={"": "disk"}, offload_folder=str(tmp_path / "offload"))
    assert all(p.is_meta for p in model.model.parameters())
    assert model.device == torch.device("cpu")  # accelerate's execution device, not 'meta'
    _close(model.score(PAIRS), rl.load(str(tiny_root["llama"])).score(PAIRS))


def test_device_maps_without_real_devices_are_refused(tiny_root):
    folder = str(tiny_root["llama"])
    with pytest.raises(ValueError, match="'meta'.*holds no values"):
        rl.load(folder, device_map="meta")
    with pytest.raises(ValueError, match=r"device_map\['model.norm'\] places weights on 'meta'"):
        rl.load(folder, device_map={"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "meta",
                                    "score": "cpu"})
    kind, count = _accelerators()
    missing = f"{kind or 'cuda'}:{count}"  # one past the last device this machine has
    with pytest.raises(ValueError, match="asks for device .* but this machine has"):
        rl.load(folder, device_map={"": missing})
    with pytest.raises(ValueError, match="asks for device .* but this machine has"):
        rl.load(folder, device_map=missing)
    with pytest.raises(ValueError, match="asks for device .* but this machine has"):
        rl.load(folder, device=missing)
    if kind is None:
        with pytest.raises(ValueError, match="no accelerator"):
            rl.load(folder, device_map=0)


def test_a_judge_whose_lm_head_is_offloaded_reads_its_real_rows(tmp_path):
    """A judge's head rows are two rows of the LM head: read where an offloaded head's weights are real."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rewardlens.zoo import build_tokenizer

    tok = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    placement = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu",
                 "lm_head": "disk"}
    offloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "lm", device_map=placement,
                                                     offload_folder=str(tmp_path / "offload"))
    assert offloaded.lm_head.weight.is_meta
    judge = rl.model.wrap_judge(offloaded, tok, tokens=("A", "B"))
    plain = rl.model.wrap_judge(AutoModelForCausalLM.from_pretrained(tmp_path / "lm"), tok, tokens=("A", "B"))
    torch.testing.assert_close(judge.head.weight, plain.head.weight, rtol=0, atol=0)
    _close(judge.score(PAIRS), plain.score(PAIRS))
    assert offloaded.lm_head.weight.is_meta  # offloaded again, not left in memory
