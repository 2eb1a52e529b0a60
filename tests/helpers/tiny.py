"""Random-init tiny reward models of every supported architecture, built from configs.

Norm weights and every bias are perturbed away from their init (1 and 0) so that a
decomposition that forgot γ, β or a bias could not pass the closure tests by accident.
`ARCHS` names them; `PAIRS` are the pairs the tests score them on (the `pairs` fixture).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers as tf

from rewardlens import Pair
from rewardlens.model._armorm import LlamaForRewardModelWithGating
from rewardlens.zoo import build_tokenizer

D, FF, L, H = 64, 128, 2, 4


def _common(tok) -> dict:
    return dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None, num_labels=1)


def configs(tok) -> dict[str, tuple[type, object]]:
    """name → (model class, config) for every architecture the foundation supports."""
    v, c = len(tok), _common(tok)
    dec = dict(vocab_size=v, hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H,
               max_position_embeddings=256, **c)
    seq = tf.AutoModelForSequenceClassification
    gate_pattern = gate_pattern_ids(tok)
    return {
        "llama": (seq, tf.LlamaConfig(num_key_value_heads=2, **dec)),
        "mistral": (seq, tf.MistralConfig(num_key_value_heads=2, sliding_window=None, **dec)),
        "qwen2": (seq, tf.Qwen2Config(num_key_value_heads=2, **dec)),
        "qwen3": (seq, tf.Qwen3Config(num_key_value_heads=2, head_dim=24, **dec)),
        "phi3": (seq, tf.Phi3Config(num_key_value_heads=H, **dec)),
        "gemma": (seq, tf.GemmaConfig(num_key_value_heads=1, head_dim=16, **dec)),
        "gemma2": (seq, tf.Gemma2Config(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, **dec)),
        "gemma3": (seq, tf.Gemma3TextConfig(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, **dec)),
        # Multimodal Gemma-3: the language model's sizes sit in text_config; a tiny vision tower rides along.
        # Its sliding window (8) is shorter than the test texts, so every instrument meets one.
        "gemma3-mm": (seq, tf.Gemma3Config(
            text_config=tf.Gemma3TextConfig(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                                            sliding_window=8, **dec),
            vision_config=tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                num_attention_heads=2, image_size=28, patch_size=14),
            mm_tokens_per_image=1, **c)),
        "olmo2": (seq, tf.Olmo2Config(num_key_value_heads=2, **dec)),
        "gpt2": (seq, tf.GPT2Config(vocab_size=v, n_embd=D, n_layer=L, n_head=H, n_positions=256, **c)),
        "gpt_neox": (seq, tf.GPTNeoXConfig(use_parallel_residual=True, **dec)),
        "bert": (seq, tf.BertConfig(vocab_size=v, hidden_size=D, intermediate_size=FF, num_hidden_layers=L,
                                    num_attention_heads=H, max_position_embeddings=256, **c)),
        "deberta-v2": (seq, tf.DebertaV2Config(
            vocab_size=v, hidden_size=D, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H,
            max_position_embeddings=256, relative_attention=True, pos_att_type=["c2p", "p2c"],
            position_biased_input=False, max_relative_positions=64, **c)),
        # Positions start at pad_token_id + 1; type_vocab_size=1 as in the released checkpoints.
        "roberta": (seq, tf.RobertaConfig(type_vocab_size=1, **dec)),
        "xlm-roberta": (seq, tf.XLMRobertaConfig(type_vocab_size=1, **dec)),
        # Mixture-of-experts: 4 experts, top-2 routing; Qwen2-MoE adds a shared expert (tests/exact/test_moe.py).
        "mixtral": (seq, tf.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **dec)),
        "qwen2_moe": (seq, tf.Qwen2MoeConfig(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=32, shared_expert_intermediate_size=64, **dec)),
        "qwen3_moe": (seq, tf.Qwen3MoeConfig(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=32, head_dim=16, **dec)),
        "armorm": (LlamaForRewardModelWithGating, tf.LlamaConfig(
            num_key_value_heads=2, num_objectives=3, gating_hidden_dim=16, gating_n_hidden=2,
            gating_temperature=10.0, gating_token_pattern=gate_pattern,
            architectures=["LlamaForRewardModelWithGating"], **dec)),
    }


def gate_pattern_ids(tok) -> list[int]:
    """ChatML's analogue of ArmoRM's Llama-3 gate pattern: end of user turn, assistant header."""
    return tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)


def perturb_(model: torch.nn.Module, seed: int) -> None:
    """Move every 1-D parameter (norm scales, biases) and the head off their trivial init."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
            if name.endswith(("score.weight", "classifier.weight", "classifier.out_proj.weight",
                              "regression_layer.weight")):
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        if hasattr(model, "reward_transform_matrix"):
            k = model.reward_transform_matrix.shape[0]
            model.reward_transform_matrix.copy_(torch.eye(k) + 0.3 * torch.randn(k, k, generator=gen))


def build(name: str, tok, root: Path, seed: int = 0) -> Path:
    """Save a tiny random `name` reward model with `tok` under `root/name` and return the folder."""
    cls, config = configs(tok)[name]
    torch.manual_seed(seed)
    model = (cls.from_config(config) if cls is tf.AutoModelForSequenceClassification else cls(config)).eval()
    perturb_(model, seed)
    path = root / name
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
"""Mixture-of-experts decoders (also in ARCHS); tests/exact/test_moe.py builds its own, with decisive routers."""


def moe_config(name: str, tok, **overrides) -> tf.PretrainedConfig:
    """A tiny `name` mixture-of-experts config: 2 layers, 4 experts, top-2 routing (Qwen2-MoE: a shared expert)."""
    c = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, **_common(tok))
    moe = dict(num_experts_per_tok=2, moe_intermediate_size=16, **overrides)
    if name == "mixtral":
        moe.pop("moe_intermediate_size")
        return tf.MixtralConfig(num_local_experts=4, **moe, **c)
    if name == "qwen2_moe":
        return tf.Qwen2MoeConfig(num_experts=4, shared_expert_intermediate_size=32, **moe, **c)
    return tf.Qwen3MoeConfig(num_experts=4, head_dim=8, **moe, **c)


def build_moe(name: str, tok, root: Path, seed: int = 0, **overrides) -> Path:
    """Save a tiny random mixture-of-experts reward model under `root/name`; its routers are scaled up
    so that tokens choose different experts (at init every router is near uniform)."""
    torch.manual_seed(seed)
    model = tf.AutoModelForSequenceClassification.from_config(moe_config(name, tok, **overrides)).eval()
    perturb_(model, seed)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith(".mlp.gate.weight"):
                p.mul_(30.0)
    path = root / name
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def unpadded(model, inputs):
    """Keyword arguments of one unpadded forward per sequence, as rewardlens tokenizes them: the
    independent yardstick (no batching, no padding, no hooks)."""
    seqs, _ = model.encode(inputs)
    for s in seqs:
        kwargs = {"input_ids": torch.tensor([s.ids])}
        if s.type_ids is not None:
            kwargs["token_type_ids"] = torch.tensor([s.type_ids])
        yield kwargs


def own_scores(model, inputs) -> np.ndarray:
    """The Hugging Face model's own reward for each sequence, one unpadded forward each."""
    out = []
    for kwargs in unpadded(model, inputs):
        with torch.no_grad():
            res = model.model(**kwargs)
        score = getattr(res, "score", None)  # ArmoRM returns its gated total as `score`
        out.append(float(score[0]) if score is not None else float(res.logits[0, 0]))
    return np.array(out)


ARCHS = list(configs(build_tokenizer()).keys())

FAMILIES: dict[str, tuple[str, ...]] = {
    "pre-norm RMS decoder": ("llama", "mistral", "qwen2", "qwen3", "phi3"),
    "sandwich-norm decoder": ("gemma2", "gemma", "gemma3", "gemma3-mm", "olmo2"),
    "LayerNorm decoder": ("gpt2",),
    "parallel-residual decoder": ("gpt_neox",),
    "post-norm encoder": ("bert", "deberta-v2", "roberta", "xlm-roberta"),
    "mixture of experts": ("qwen2_moe", "mixtral", "qwen3_moe"),
    "gated multi-objective head": ("armorm",),
}
"""`ARCHS` grouped by the shape of their `ArchitectureMap` (norm, residual layout, MLP, head); the first of each
family stands for it in the fast loop (`pytest -m "not slow"`, tests/conftest.py), CI runs every one."""

FAMILY_OF = {arch: family for family, members in FAMILIES.items() for arch in members}
"""arch → its family in `FAMILIES`."""

PAIRS = [
    Pair("What is the capital of France?", "The capital of France is Paris.", "France is in Europe."),
    Pair("How do I boil an egg?", "Place the egg in boiling water for nine minutes, then cool it.", "Eggs."),
    Pair([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 times 12?"}],
         "144.", "12 times 12 is 124, I am quite sure about that."),
]
