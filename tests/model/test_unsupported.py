"""What rewardlens cannot decompose is refused up front, by name, never with a raw tensor error (issue 18
part 3). Mixture-of-experts decoders are supported (tests/exact/test_moe.py); refused there: a map naming a
module inside the sparse block, a neuron split of a dense MLP block beside sparse ones (or inside an
expert), and the expert split of a sparse block whose layout is not understood."""

import numpy as np
import pytest
import torch
import transformers as tf

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import ArchitectureError
from rewardlens.model.internal import projection_inputs
from tests.helpers.tiny import MOE, PAIRS, build_moe, own_scores


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("unsupported")
    out = {name: build_moe(name, tokenizer, root) for name in MOE}
    # Qwen2-MoE with a dense layer 0 beside the sparse layer 1.
    out["mixed"] = build_moe("qwen2_moe", tokenizer, root / "mixed", mlp_only_layers=[0])
    torch.manual_seed(0)
    dense = tf.AutoModelForSequenceClassification.from_config(tf.Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None, num_labels=1)).eval()
    dense.save_pretrained(root / "qwen2")
    tokenizer.save_pretrained(root / "qwen2")
    out["qwen2"] = root / "qwen2"
    return out


INSIDE = [(m, p) for m in MOE for p in ("mlp.experts", "mlp.gate")] + [("qwen2_moe", "mlp.shared_expert.down_proj")]


@pytest.mark.parametrize(("model_type", "inside"), INSIDE)
def test_wrap_refuses_a_map_naming_a_module_inside_the_sparse_block(folders, tokenizer, model_type, inside):
    """Modules inside a sparse block see flattened [n·T, d] states and write part of the sum (or nothing):
    refused by name, with the fix, before the closure proof runs (it used to die on a tensor size)."""
    model = tf.AutoModelForSequenceClassification.from_pretrained(folders[model_type]).eval()
    llama_like = rl.model.ArchitectureMap(name="llama-like", layers="model.layers", attn_out="self_attn.o_proj",
                                   mlp_out=inside, final_norm="model.norm")
    with pytest.raises(ArchitectureError) as info:
        rl.wrap(model, tokenizer, arch=llama_like)
    message = str(info.value)
    assert f"names {inside!r} as layer 0's MLP output" in message and "mixture-of-experts block 'mlp'" in message
    assert "Set mlp_out='mlp'" in message, message


def test_an_expert_split_of_an_unknown_block_layout_is_refused_up_front(folders, pairs):
    """A sparse block with a child whose role in the sum is unknown: sublayers still close (the block's
    output is the write); level='neuron' is refused before any forward, naming the child."""
    model = rl.load(str(folders["qwen3_moe"]))
    block = model.layer_module(1, "mlp")
    block.add_module("residual_scale", torch.nn.Identity())
    try:
        np.testing.assert_allclose(rl.attribute(model, pairs).reward, own_scores(model, pairs), rtol=1e-5, atol=1e-6)
        with pytest.raises(ArchitectureError, match="children \\['residual_scale'\\] whose role in the sum"):
            rl.attribute(model, pairs, level="neuron")
    finally:
        del block.residual_scale


def test_neurons_inside_an_expert_are_refused(folders):
    """level='neuron' splits a sparse block into experts; the neurons inside experts have no part and no
    output projection to read them from."""
    model = rl.load(str(folders["mixtral"]))
    with pytest.raises(ArchitectureError, match="splits a sparse block into its experts \\(not into the neurons"):
        projection_inputs(model, "mlp", 0)
    with pytest.raises(ValueError, match="not to a neuron"):
        rl.model.Part.mlp(0, 3, expert=1)


def test_a_dense_model_of_the_same_family_keeps_its_neurons(folders):
    """The control: the refusals key on sparse blocks, not on the family (dense Qwen2 with the same sizes
    keeps its down_proj map and splits into neurons)."""
    rm = rl.load(str(folders["qwen2"]))
    assert rm.arch.mlp_out == "mlp.down_proj"
    att = rl.attribute(rm, PAIRS, level="neuron")
    assert "mlp_L0_N63" in att.names
    np.testing.assert_allclose(att.reward, own_scores(rm, PAIRS), rtol=1e-5, atol=1e-6)


def test_the_command_line_says_it_in_one_line_with_exit_code_2(folders, tmp_path, capsys):
    """A neuron split of the dense MLP block beside sparse ones (Qwen2-MoE's mlp_only_layers)."""
    pairs_file = save_pairs(PAIRS[:1], tmp_path / "pairs.jsonl")
    assert main(["attribute", str(folders["mixed"]), "--pairs", str(pairs_file), "--level", "neuron"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "layer 0's mlp output 'mlp' (Qwen2MoeMLP) is not a linear projection" in err, err
    assert "pass layers= with only the sparse layers" in err, err
