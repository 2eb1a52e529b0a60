"""Architecture maps: where each part of a reward model lives, as data.

A map names module paths (relative to the top-level model, or to one layer for per-layer
fields), the norm kind and the residual layout. Adding an architecture is adding a map and a
closure test; `register_architecture` lets users do it for their own (remote-code) models.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from torch import nn

from ..errors import ArchitectureError, HeadError, UsageError
from ..types import HeadKind, Layout, NormKind, Pooling
from ._norms import NORM_KINDS, detect_norm_kind
from ._sparse import moe_paths

if TYPE_CHECKING:
    from transformers import PretrainedConfig

LAYOUTS: tuple[Layout, ...] = get_args(Layout)
HEAD_KINDS: tuple[HeadKind, ...] = get_args(HeadKind)
POOLINGS: tuple[Pooling, ...] = get_args(Pooling)


def hf_config(model: nn.Module) -> PretrainedConfig:
    """`model.config`: every model rewardlens reads is a Hugging Face model, whose config an
    `nn.Module` type cannot name (module attributes type as `Tensor | Module`)."""
    return cast("PretrainedConfig", model.config)


def text_config(model: nn.Module) -> PretrainedConfig:
    """The config that holds the language model's sizes (heads, width, positions, pad id).

    The top-level config itself for text models; its `text_config` for multimodal ones
    (Gemma-3's `Gemma3Config`), whose top level holds no sizes."""
    config = hf_config(model)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


PositionIds = Literal["mask", "model"]
"""How a forward gets its position ids: 'mask' — rewardlens passes `cumsum(attention_mask) − 1`,
the unpadded sequence's positions 0..T−1; 'model' — rewardlens passes none and pads with the
model's pad id, from which the model numbers them itself (RoBERTa: `padding_idx + 1 + i`)."""
POSITION_IDS: tuple[PositionIds, ...] = get_args(PositionIds)


@dataclass(frozen=True)
class ArchitectureMap:
    """Declarative description of a sequence-classification reward model."""

    name: str
    """Short name shown in reports."""
    layers: str
    """Path of the ModuleList of transformer layers, from the top-level model."""
    attn_out: str
    """Attention output projection, relative to a layer; its input is the concatenated heads."""
    mlp_out: str
    """MLP down-projection, relative to a layer; its input holds the neurons. For a mixture-of-experts
    MLP, the whole sparse block (`mlp`: router, experts and any shared expert), split into experts."""
    final_norm: str | None
    """Final norm before the head (None for post-norm encoders, whose last layer ends in a norm)."""
    head: str = "score"
    """Path of the linear head (`classifier` for encoders, `regression_layer` for ArmoRM)."""
    norm: NormKind = "rms"
    """Kind of every norm in the model: 'rms', 'rms_offset' (Gemma's 1+γ) or 'layer'."""
    layout: Layout = "pre_norm"
    """'pre_norm' (x + f(N(x))), 'parallel' (GPT-NeoX) or 'post_norm' (BERT: N(x + f(x)))."""
    attn_post_norm: str | None = None
    """Norm applied to the attention output before it is added (Gemma-2, OLMo-2), per layer."""
    mlp_post_norm: str | None = None
    """Norm applied to the MLP output before it is added (Gemma-2, OLMo-2), per layer."""
    attn_residual_norm: str | None = None
    """post_norm only: the norm of (x + attention), per layer."""
    mlp_residual_norm: str | None = None
    """post_norm only: the norm of (x + MLP), per layer."""
    mlp_in: str | None = None
    """post_norm only: the module, relative to a layer, whose input is the MLP's input, where no one module
    is the MLP alone (BERT's `intermediate`: the up-projection and the activation; the MLP's output is then
    `mlp_out`'s output, before dropout, the residual and the norm). None: the parent of `mlp_out` is the
    whole MLP (its input the MLP's input, its output the MLP's output)."""
    head_kind: HeadKind = "linear"
    """'linear' (w·h + b), 'pooler' (classifier(act(dense(h)))) or 'gated' (ArmoRM)."""
    pooler: str | None = None
    """pooler head only: path of the pooler's dense layer."""
    pooler_act: str = "tanh"
    """pooler head only: activation name (overridden by config.pooler_hidden_act when present)."""
    pooling: Pooling = "last"
    """Read position: 'last' (the last non-pad token, decoders) or 'first' (encoders' [CLS])."""
    gate: str | None = None
    """gated head only: path of the gating network."""
    attn_values: str | None = None
    """Value projection relative to a layer (output [n, T, H·d_head]), for attention that does not go
    through transformers' `AttentionInterface` (DeBERTa-v2): token attribution reads values there."""
    attn_q: str | None = None
    """Query projection relative to a layer (output [n, T, H·d_head], head h at columns h·d_head..), for
    path patching's per-head query receivers; None where queries, keys and values share one fused
    projection (GPT-2's `c_attn`, GPT-NeoX's `query_key_value`, Phi-3's `qkv_proj`)."""
    attn_k: str | None = None
    """Key projection relative to a layer (as `attn_q`; [n, T, H_kv·d_head])."""
    attn_v: str | None = None
    """Value projection relative to a layer (as `attn_q`; [n, T, H_kv·d_head])."""
    position_ids: PositionIds = "mask"
    """'mask' (rewardlens passes 0-based positions) or 'model' (the model numbers positions from its pad
    id, RoBERTa/XLM-R: positions then start at pad_token_id + 1 and the usable length shrinks to match)."""

    def __post_init__(self) -> None:
        if self.norm not in NORM_KINDS:
            raise UsageError(f"norm must be one of {NORM_KINDS}, got {self.norm!r}")
        if self.layout not in LAYOUTS:
            raise UsageError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.head_kind not in HEAD_KINDS:
            raise UsageError(f"head_kind must be one of {HEAD_KINDS}, got {self.head_kind!r}")
        if self.pooling not in POOLINGS:
            raise UsageError(f"pooling must be 'last' or 'first', got {self.pooling!r}")
        if self.position_ids not in POSITION_IDS:
            raise UsageError(f"position_ids must be one of {POSITION_IDS}, got {self.position_ids!r}")
        if self.layout == "post_norm" and not (self.attn_residual_norm and self.mlp_residual_norm and self.mlp_in):
            raise UsageError("layout='post_norm' needs attn_residual_norm, mlp_residual_norm and mlp_in (the module "
                             "whose input is the MLP's input: BERT's 'intermediate')")
        if self.layout != "post_norm" and self.final_norm is None:
            raise UsageError(f"layout={self.layout!r} needs final_norm (the norm the head reads)")
        if self.head_kind == "pooler" and self.pooler is None:
            raise UsageError("head_kind='pooler' needs pooler (the pooler's dense layer path)")
        if self.head_kind == "gated" and self.gate is None:
            raise UsageError("head_kind='gated' needs gate (the gating network path)")

    @property
    def residual_norms(self) -> tuple[str, str]:
        """post_norm only: the paths of the (attention, MLP) residual norms, per layer."""
        if self.attn_residual_norm is None or self.mlp_residual_norm is None:
            raise ArchitectureError(f"map {self.name!r} (layout={self.layout!r}) has no residual norms")
        return self.attn_residual_norm, self.mlp_residual_norm


def _decoder(name: str, prefix: str = "model", **kw: Any) -> ArchitectureMap:
    return ArchitectureMap(
        name=name,
        layers=f"{prefix}.layers",
        attn_out=kw.pop("attn_out", "self_attn.o_proj"),
        mlp_out=kw.pop("mlp_out", "mlp.down_proj"),
        final_norm=f"{prefix}.norm",
        **{f"attn_{x}": kw.pop(f"attn_{x}", f"self_attn.{x}_proj") for x in "qkv"},
        **kw,
    )


# Field values shared by several maps (keyword arguments of ArchitectureMap, checked by its __post_init__).
_POST: dict[str, Any] = dict(attn_post_norm="post_attention_layernorm", mlp_post_norm="post_feedforward_layernorm")
_ENCODER: dict[str, Any] = dict(
    attn_out="attention.output.dense",
    mlp_out="output.dense",
    mlp_in="intermediate",
    final_norm=None,
    head="classifier",
    norm="layer",
    layout="post_norm",
    attn_residual_norm="attention.output.LayerNorm",
    mlp_residual_norm="output.LayerNorm",
    head_kind="pooler",
    pooling="first",
)

# RoBERTa/XLM-R: BERT's layers; the classifier reads <s> through dense -> tanh -> out_proj (a pooler head),
# and the embeddings number positions from the pad id (padding_idx + 1 + i), not from 0.
_ROBERTA: dict[str, Any] = {**_ENCODER, "head": "classifier.out_proj", "pooler": "classifier.dense",
                            "layers": "roberta.encoder.layer", "position_ids": "model"}
_BERT_QKV: dict[str, Any] = {f"attn_{x}": f"attention.self.{n}" for x, n in zip("qkv", ("query", "key", "value"))}

LLAMA = _decoder("llama")
ARMORM = replace(LLAMA, name="armorm", head="regression_layer", head_kind="gated", gate="gating")

_REGISTRY: dict[str, ArchitectureMap] = {
    "llama": LLAMA,
    "mistral": _decoder("mistral"),
    "qwen2": _decoder("qwen2"),
    "qwen3": _decoder("qwen3"),
    "phi3": _decoder("phi3", attn_q=None, attn_k=None, attn_v=None),  # one fused qkv_proj
    "gemma": _decoder("gemma", norm="rms_offset"),
    "gemma2": _decoder("gemma2", norm="rms_offset", **_POST),
    # Gemma-3 (text) is Gemma-2's residual layout; its q/k norms sit inside attention, before o_proj.
    "gemma3_text": _decoder("gemma3", norm="rms_offset", **_POST),
    # Multimodal Gemma-3 (Gemma3Config): the same language model under model.language_model, read on text
    # alone (the vision tower only runs on pixel values, which rewardlens never passes).
    "gemma3": _decoder("gemma3-mm", prefix="model.language_model", norm="rms_offset", **_POST),
    "olmo2": _decoder("olmo2", **_POST),
    "gpt2": ArchitectureMap(
        name="gpt2", layers="transformer.h", attn_out="attn.c_proj", mlp_out="mlp.c_proj",
        final_norm="transformer.ln_f", norm="layer",
    ),
    "gpt_neox": ArchitectureMap(
        name="gpt_neox", layers="gpt_neox.layers", attn_out="attention.dense",
        mlp_out="mlp.dense_4h_to_h", final_norm="gpt_neox.final_layer_norm", norm="layer",
        layout="parallel",
    ),
    "bert": ArchitectureMap(name="bert", layers="bert.encoder.layer", pooler="bert.pooler.dense", **_ENCODER,
                            **_BERT_QKV),
    "deberta-v2": ArchitectureMap(
        name="deberta-v2", layers="deberta.encoder.layer", pooler="pooler.dense", pooler_act="gelu",
        attn_values="attention.self.value_proj", attn_q="attention.self.query_proj",
        attn_k="attention.self.key_proj", attn_v="attention.self.value_proj", **_ENCODER
    ),
    "roberta": ArchitectureMap(name="roberta", **_ROBERTA, **_BERT_QKV),
    "xlm-roberta": ArchitectureMap(name="xlm-roberta", **_ROBERTA, **_BERT_QKV),
    # Mixture-of-experts decoders: the MLP sublayer is the whole sparse block (router, experts, shared expert).
    "mixtral": _decoder("mixtral", mlp_out="mlp"),
    "qwen2_moe": _decoder("qwen2_moe", mlp_out="mlp"),
    "qwen3_moe": _decoder("qwen3_moe", mlp_out="mlp"),
    # Keyed by class name: ArmoRM's config says model_type "llama"; its architectures entry decides.
    "LlamaForRewardModelWithGating": ARMORM,
}


def position_limit(model: nn.Module, arch: ArchitectureMap) -> int | None:
    """The longest sequence the position embeddings hold: `max_position_embeddings`, less the
    `pad_token_id + 1` ids a model that numbers positions from its pad id never uses (RoBERTa's
    514 positions with pad id 1 hold 512 tokens); None when the config names no limit."""
    config = text_config(model)
    limit = getattr(config, "max_position_embeddings", None)
    pad = getattr(config, "pad_token_id", None)
    if limit is None or arch.position_ids != "model" or pad is None:
        return limit
    return int(limit) - int(pad) - 1


def check_position_pad(arch: ArchitectureMap, model_pad: int | None, pad_token_id: int | None) -> None:
    """A model that numbers positions from its pad id (`position_ids='model'`) must be padded with
    that id: any other fill, under left padding, would shift every real token's position."""
    if arch.position_ids == "model" and pad_token_id != model_pad:
        raise ArchitectureError(
            f"map {arch.name!r} lets the model number positions from its pad id {model_pad} (position i of "
            f"a sequence is pad_id + 1 + i), so batches must be padded with it, not with pad_token_id="
            f"{pad_token_id}; drop pad_token_id= (an encoder reads its first token whatever the pad id)",
            option="pad_token_id"
        )


def register_architecture(
    arch: ArchitectureMap, *, model_types: tuple[str, ...] = (), architectures: tuple[str, ...] = ()
) -> None:
    """Make `load` use `arch` for configs with these `model_type`s or `architectures` class names."""
    if not model_types and not architectures:
        raise UsageError("register_architecture needs at least one model_type or architectures name")
    for key in (*model_types, *architectures):
        _REGISTRY[key] = arch


def find_map(model: nn.Module) -> ArchitectureMap:
    """The registered map for `model` (class name first, then model_type), else structural discovery."""
    config = hf_config(model)
    for key in (type(model).__name__, *(getattr(config, "architectures", None) or ())):
        if key in _REGISTRY:
            return _REGISTRY[key]
    model_type = getattr(config, "model_type", None)
    if model_type in _REGISTRY:
        return _REGISTRY[model_type]
    return discover(model)


def get_module(root: nn.Module, path: str) -> nn.Module:
    """`root.get_submodule(path)` with an error that names the map field to fix."""
    try:
        return root.get_submodule(path)
    except AttributeError as exc:
        raise ArchitectureError(
            f"module path {path!r} does not exist in {type(root).__name__}; fix the architecture map "
            f"(see docs/architectures.md) — {exc}"
        ) from None


def _is_projection(module: nn.Module, width: int) -> bool:
    if isinstance(module, nn.Linear):
        return module.out_features == width
    weight = getattr(module, "weight", None)  # GPT-2's Conv1D stores weight as [in, out]
    return type(module).__name__ == "Conv1D" and weight is not None and weight.shape[-1] == width


def discover(model: nn.Module) -> ArchitectureMap:
    """Find layers, projections, final norm and head by structure, for an unregistered decoder.

    The result is only a proposal: `rewardlens.load`/`wrap` (and the first decomposition) prove
    closure on the loaded model before any number is reported.
    """
    config = hf_config(model)
    n_layers = getattr(text_config(model), "num_hidden_layers", None)
    width = getattr(text_config(model), "hidden_size", None)
    found: dict[str, str] = {}
    layers_path = next(
        (n for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n_layers), None
    )
    if layers_path is None or width is None:
        raise ArchitectureError(
            f"unknown architecture {type(model).__name__} (model_type={getattr(config, 'model_type', None)!r}): "
            f"found no ModuleList of num_hidden_layers={n_layers} layers (hidden_size={width}); "
            "register a map with rewardlens.model.register_architecture (docs/architectures.md)"
        )
    found["layers"] = layers_path
    layer = get_module(model, f"{layers_path}.0")
    projections = [n for n, m in layer.named_modules() if n and _is_projection(m, width)]
    attn = [n for n in projections if "attn" in n.lower() or "attention" in n.lower()]
    mlp = [n for n in projections if n not in attn and any(k in n.lower() for k in ("mlp", "ffn", "feed_forward"))]
    # A mixture-of-experts MLP is its whole sparse block (any layer's: some layers may be dense); a projection
    # inside it (the shared expert's down_proj) writes only part of the sum, on flattened [n·T, d] states.
    sparse = next((p for m in get_module(model, layers_path).children() for p in moe_paths(m)[:1]), None)
    norm_children = [n for n, m in layer.named_children() if "norm" in type(m).__name__.lower()]
    head_candidates = [
        n for n, m in model.named_children()
        if isinstance(m, nn.Linear) and m.in_features == width and m.out_features == config.num_labels
    ]
    base = getattr(model, "base_model_prefix", "")
    outer_norms = [
        n for n, m in model.named_modules()
        if n.startswith(base) and not n.startswith(layers_path) and "norm" in type(m).__name__.lower()
    ]
    if attn:
        found["attn_out"] = attn[-1]
    if sparse is not None:
        found["mlp_out"] = sparse
    elif mlp:
        found["mlp_out"] = mlp[-1]
    if head_candidates:
        found["head"] = head_candidates[-1]
    if outer_norms:
        found["final_norm"] = outer_norms[-1]
    missing = [k for k in ("attn_out", "mlp_out", "head", "final_norm") if k not in found]
    if "head" in missing:
        heads = [f"{n} ({type(m).__name__})" for n, m in model.named_children() if n != base]
        raise HeadError(
            f"no linear head with in_features={width} and out_features=num_labels={config.num_labels} "
            f"among the top-level modules {heads}; rewardlens reads scalar heads r = w·h + b. "
            "If the head is linear under another shape, register a map naming it."
        )
    if missing:
        raise ArchitectureError(
            f"unknown architecture {type(model).__name__}: could not find {missing} by structure "
            f"(found {found}; layer-0 projections to width {width}: {projections}); "
            "register a map with rewardlens.model.register_architecture (docs/architectures.md)"
        )
    if len(norm_children) > 2:
        raise ArchitectureError(
            f"unknown architecture {type(model).__name__}: each layer has {len(norm_children)} norms "
            f"({norm_children}), so sublayer outputs may be normalised before they are added; structural "
            "discovery only proves the plain pre-norm layout — register a map with attn_post_norm/mlp_post_norm"
        )
    kind = detect_norm_kind(get_module(model, found["final_norm"]), width)
    if kind is None:
        raise ArchitectureError(
            f"final norm {found['final_norm']!r} ({type(get_module(model, found['final_norm'])).__name__}) "
            "is neither RMSNorm, Gemma-style RMSNorm nor LayerNorm on a check input; register a map"
        )
    return ArchitectureMap(
        name=f"discovered:{getattr(config, 'model_type', type(model).__name__)}",
        layers=found["layers"], attn_out=found["attn_out"], mlp_out=found["mlp_out"],
        final_norm=found["final_norm"], head=found["head"], norm=kind, **_qkv_paths(layer),  # type: ignore[arg-type]
    )


def _qkv_paths(layer: nn.Module) -> dict[str, str]:
    """Separate `*q_proj`/`*k_proj`/`*v_proj` linears in a layer (one each), as `attn_q`/`attn_k`/`attn_v`;
    none when any is missing or ambiguous (a fused projection: per-head q/k/v receivers then refuse)."""
    found = {x: [n for n, m in layer.named_modules() if n.endswith(f"{x}_proj") and isinstance(m, nn.Linear)]
             for x in "qkv"}
    return {f"attn_{x}": names[0] for x, names in found.items()} if all(len(n) == 1 for n in found.values()) else {}
