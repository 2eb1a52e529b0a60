"""Architecture discovery for unknown decoders, refusals that say why, and user-registered maps."""

import numpy as np
import pytest
import torch
import transformers as tf
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

import rewardlens as rl
from rewardlens.errors import ArchitectureError, ClosureError
from rewardlens.model import _arch as arch_mod
from tests.helpers import tiny


def _save(model, tokenizer, path):
    tiny.perturb_(model, 1)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _decoder_kwargs(tok):
    return dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, num_labels=1,
                pad_token_id=tok.pad_token_id)


@pytest.mark.parametrize("config_cls", [tf.StableLmConfig, tf.Starcoder2Config])
def test_unregistered_decoder_is_discovered_and_proven(config_cls, tokenizer, tmp_path, pairs):
    model = tf.AutoModelForSequenceClassification.from_config(config_cls(**_decoder_kwargs(tokenizer))).eval()
    assert model.config.model_type not in arch_mod._REGISTRY
    rm = rl.load(_save(model, tokenizer, tmp_path))
    assert rm.arch.name.startswith("discovered:")
    att = rl.attribute(rm, pairs, level="head")
    assert np.abs(att.residual_error).max() <= 1e-4 * np.abs(att.values).sum(1).max()


def test_discovery_refuses_when_it_cannot_prove_closure(tokenizer, tmp_path, monkeypatch):
    # OLMo-2 normalises each sublayer's output before adding it; without its map, discovery
    # cannot know that, and the probe shows the parts do not add up.
    model = tf.AutoModelForSequenceClassification.from_config(tf.Olmo2Config(**_decoder_kwargs(tokenizer))).eval()
    path = _save(model, tokenizer, tmp_path)
    monkeypatch.delitem(arch_mod._REGISTRY, "olmo2")
    with pytest.raises(ClosureError, match=r"do not add up.*post_norm"):
        rl.load(path)


def test_discovery_names_what_it_could_not_find(tokenizer):
    class Odd(tf.PreTrainedModel):
        config_class = tf.PretrainedConfig
        base_model_prefix = "body"

        def __init__(self, config):
            super().__init__(config)
            self.body = nn.Sequential(nn.Embedding(config.vocab_size, 64), nn.Linear(64, 64))
            self.score = nn.Linear(64, 1)

    odd = Odd(tf.PretrainedConfig(num_hidden_layers=2, hidden_size=64, vocab_size=len(tokenizer), num_labels=1))
    with pytest.raises(ArchitectureError, match="no ModuleList of num_hidden_layers=2"):
        rl.RewardModel.from_model(odd, tokenizer)


class ValueHeadRewardModel(tf.PreTrainedModel):
    """Shaped like InternLM2's remote-code reward model: a backbone and a `v_head`, new names."""

    config_class = tf.LlamaConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.model = tf.LlamaModel(config)
        self.v_head = nn.Linear(config.hidden_size, 1, bias=False)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, **kwargs):
        hidden = self.model(input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        return SequenceClassifierOutput(logits=self.v_head(hidden[:, -1]))


def test_user_registered_map(tokenizer, pairs, monkeypatch):
    monkeypatch.setattr(arch_mod, "_REGISTRY", dict(arch_mod._REGISTRY))
    config = tf.LlamaConfig(**{**_decoder_kwargs(tokenizer), "num_labels": 2})  # v_head ignores num_labels
    torch.manual_seed(0)
    model = ValueHeadRewardModel(config).eval()
    tiny.perturb_(model, 2)
    with pytest.raises(rl.RewardLensError):
        rl.RewardModel.from_model(model, tokenizer)  # no linear head of width num_labels to discover
    rl.model.register_architecture(
        rl.model.ArchitectureMap(name="vhead-llama", layers="model.layers", attn_out="self_attn.o_proj",
                           mlp_out="mlp.down_proj", final_norm="model.norm", head="v_head"),
        architectures=("ValueHeadRewardModel",),
    )
    rm = rl.wrap(model, tokenizer)
    assert rm.arch.name == "vhead-llama" and rm.verified
    seqs, _ = rm.encode(pairs)
    with torch.no_grad():
        own = [float(model(torch.tensor([s.ids])).logits[0, 0]) for s in seqs]
    np.testing.assert_allclose(rm.score(pairs, batch_size=3), own, rtol=1e-5)
    att = rl.attribute(rm, pairs, level="neuron")
    assert np.abs(att.residual_error).max() <= 1e-4 * np.abs(att.values).sum(1).max()


def test_map_validation_names_the_conflict():
    with pytest.raises(ValueError, match="post_norm.*attn_residual_norm"):
        rl.model.ArchitectureMap(name="x", layers="l", attn_out="a", mlp_out="m", final_norm=None, layout="post_norm")
    with pytest.raises(ValueError, match="norm must be one of"):
        rl.model.ArchitectureMap(name="x", layers="l", attn_out="a", mlp_out="m", final_norm="n", norm="batch")


def test_a_wrong_map_is_caught_before_any_number(tiny_root, pairs):
    # GPT-2 uses LayerNorm; a map that says RMSNorm gives plausible-looking but wrong rewards, and
    # its own residual_error would be ~0 (it compares against the same wrong head): refuse it.
    hf = rl.load(str(tiny_root["gpt2"])).model
    wrong = arch_mod._REGISTRY["gpt2"].__class__(**{**arch_mod._REGISTRY["gpt2"].__dict__, "norm": "rms"})
    with pytest.raises(ArchitectureError, match="wrong final norm"):
        rl.wrap(hf, rl.load(str(tiny_root["gpt2"])).tokenizer, arch=wrong)
    unchecked = rl.RewardModel.from_model(hf, rl.load(str(tiny_root["gpt2"])).tokenizer, arch=wrong)
    with pytest.raises(ArchitectureError, match="wrong final norm"):
        rl.attribute(unchecked, pairs)
