"""Architectures rewardlens cannot decompose yet are refused up front, by name, never with a raw tensor
error (issue 18 part 3): mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE)."""

import numpy as np
import pytest
import torch
import transformers as tf

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import ArchitectureError
from tests.helpers.tiny import PAIRS, own_scores

MOE = ("mixtral", "qwen2_moe", "qwen3_moe")


def _config(name: str, tok) -> tf.PretrainedConfig:
    c = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, pad_token_id=tok.pad_token_id,
             eos_token_id=tok.eos_token_id, bos_token_id=None, num_labels=1)
    if name == "mixtral":
        return tf.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **c)
    if name == "qwen2_moe":  # with a shared expert: discovery used to propose it alone as the MLP
        return tf.Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                 shared_expert_intermediate_size=32, **c)
    if name == "qwen3_moe":
        return tf.Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=8, **c)
    return tf.Qwen2Config(**c)  # the dense control


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("unsupported")
    out = {}
    for name in (*MOE, "qwen2"):
        torch.manual_seed(0)
        model = tf.AutoModelForSequenceClassification.from_config(_config(name, tokenizer)).eval()
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        out[name] = root / name
    return out


def _assert_names_the_cause(message: str, model_type: str) -> None:
    assert f"model_type={model_type!r}" in message, message
    assert "mixture-of-experts" in message and "router" in message, message
    assert "dense reward model" in message, message  # what the user can do


@pytest.mark.parametrize("model_type", MOE)
def test_load_refuses_a_mixture_of_experts_decoder_by_name(folders, model_type):
    with pytest.raises(ArchitectureError) as info:
        rl.load(str(folders[model_type]))
    _assert_names_the_cause(str(info.value), model_type)


@pytest.mark.parametrize("model_type", MOE)
def test_wrap_refuses_it_even_with_an_explicit_map(folders, tokenizer, model_type):
    """A map cannot describe a sparse MLP, so wrap(arch=...) is refused before the closure proof runs."""
    model = tf.AutoModelForSequenceClassification.from_pretrained(folders[model_type]).eval()
    llama_like = rl.ArchitectureMap(name="llama-like", layers="model.layers", attn_out="self_attn.o_proj",
                                   mlp_out="mlp.experts", final_norm="model.norm")
    for arch in (None, llama_like):
        with pytest.raises(ArchitectureError) as info:
            rl.wrap(model, tokenizer, arch=arch)
        _assert_names_the_cause(str(info.value), model_type)


def test_a_dense_model_of_the_same_family_still_loads_and_scores(folders):
    """The control: the refusal keys on experts, not on the family (dense Qwen2 with the same sizes)."""
    rm = rl.load(str(folders["qwen2"]))
    np.testing.assert_allclose(rm.score(PAIRS), own_scores(rm, PAIRS), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_type", MOE)
def test_the_command_line_says_it_in_one_line_with_exit_code_2(folders, model_type, tmp_path, capsys):
    pairs_file = save_pairs(PAIRS[:1], tmp_path / "pairs.jsonl")
    assert main(["score", str(folders[model_type]), "--pairs", str(pairs_file)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    _assert_names_the_cause(err, model_type)
