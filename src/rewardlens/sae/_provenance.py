"""Where an SAE came from and what it claims, and the check that it belongs to the model it is applied to.

A folder's claims are read from the fields its own tool writes: SAELens' `cfg.json` (`model_name`,
`hook_name`, `hook_layer`, `dtype`; SAELens 6 moves some into `metadata`), sparsify's run
`config.json` beside the hook-point folders (`model`), and rewardlens' own keys in `cfg.json`
(`model_name`, `model_fingerprint`, `hook_point`, `positions`). Base-model names are compared
after `base_name`: lower case, a trailing `/` dropped, and only the part after the last `/` kept, so
the organisation (or a local folder's parents) is optional: `EleutherAI/Pythia-70M` matches
`pythia-70m` and `/models/pythia-70m`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import SAEMismatchError, warn
from ..model import RewardModel, TraceKey

RUN_CONFIG = "config.json"
"""sparsify's run config, written in the parent of the hook-point folders."""
_TL_HOOKS = {"hook_resid_post": "resid", "hook_mlp_out": "mlp", "hook_attn_out": "attn", "attn.hook_z": "attn_z",
             "mlp.hook_post": "mlp_act"}
"""TransformerLens hook names (SAELens' `hook_name`: `blocks.{l}.<name>`) → rewardlens' trace kinds."""
_MODULE_SUFFIX = {"": "resid", ".mlp": "mlp", ".self_attn": "attn", ".attn": "attn", ".attention": "attn"}
"""sparsify hook points are module paths: `layers.3` (a layer's output), `layers.3.mlp`, `layers.3.self_attn`."""


@dataclass(frozen=True)
class Provenance:
    """What an SAE folder says about itself (None: the folder does not say).

    `hook`: the hook point as the folder names it (SAELens' `hook_name`, rewardlens' `hook_point`,
    else the folder's name); `point`: the rewardlens hook point it stands for (`resid_3`), when
    recognised; `layer`: that point's layer (or SAELens' `hook_layer`); `dtype`: the stored weights';
    `base_model`: the model it was trained on; `model_fingerprint`: rewardlens' checksum of that
    model (name, shape, head), for SAEs rewardlens trained; `positions`: 'all' or 'read', likewise.
    """

    format: str
    """'sparsify', 'saelens', or 'memory' (built or trained in this process)."""
    d_in: int
    n_latents: int
    k: int
    dtype: str
    folder: Path | None = None
    hook: str | None = None
    point: str | None = None
    layer: int | None = None
    base_model: str | None = None
    model_fingerprint: str | None = None
    positions: str | None = None

    def record(self) -> dict[str, Any]:
        """The keys rewardlens writes into `cfg.json` (those it knows), so a saved SAE keeps its provenance."""
        keys = {"hook_point": self.point, "model_name": self.base_model, "model_fingerprint": self.model_fingerprint,
                "positions": self.positions}
        return {k: v for k, v in keys.items() if v is not None}


def base_name(name: str) -> str:
    """A model name reduced for comparison: lower case, no trailing '/', the part after the last '/' only."""
    return name.strip().rstrip("/").lower().rsplit("/", 1)[-1]


def model_name(model: RewardModel) -> str:
    """The name the model was loaded by: its config's `_name_or_path` (a hub id or a local folder)."""
    return str(getattr(model.model.config, "_name_or_path", "") or getattr(model.model, "name_or_path", ""))


def model_identity(model: RewardModel) -> list[Any]:
    """Name, type, depth and a checksum of the head: tells fine-tunes saved under one path apart."""
    config: Any = model.model.config  # a transformers PretrainedConfig
    head = float(model.head.weight.double().sum())
    return [getattr(config, "_name_or_path", ""), config.model_type, model.n_layers, head]


def model_fingerprint(model: RewardModel) -> str:
    return hashlib.sha256(json.dumps(model_identity(model)).encode()).hexdigest()[:16]


def claimed_point(hook: str | None) -> str | None:
    """The rewardlens hook point a folder's hook name stands for, without the model: a trace name
    (`resid_3`), a TransformerLens name (`blocks.3.hook_resid_post`; `hook_resid_pre` of layer l is
    the residual after layer l − 1, `embed` for l = 0) or a module path (`layers.3`, `h.3.mlp`)."""
    if not hook:
        return None
    try:
        key = TraceKey.parse(hook)
        return key.name if key.kind not in ("gate", "attn_rnorm", "mlp_rnorm") else None  # no SAE reads these
    except ValueError:
        pass
    tl = re.fullmatch(r"blocks\.(\d+)\.(.+)", hook)
    if tl:
        layer, name = int(tl[1]), tl[2]
        if name == "hook_resid_pre":
            return TraceKey.embed().name if layer == 0 else TraceKey.resid(layer - 1).name
        return f"{_TL_HOOKS[name]}_{layer}" if name in _TL_HOOKS else None
    path = re.fullmatch(r"(?:\w+\.)*?\w+\.(\d+)((?:\.\w+)?)", hook)
    if path and path[2] in _MODULE_SUFFIX:
        return f"{_MODULE_SUFFIX[path[2]]}_{path[1]}"
    return None


def read_provenance(folder: Path, cfg: dict[str, Any], fmt: str, d_in: int, n_latents: int, k: int,
                    dtype: str) -> Provenance:
    """The claims of an SAE folder, from its `cfg.json` (`cfg`) and, for sparsify, its run's config."""
    meta: dict[str, Any] = cfg["metadata"] if isinstance(cfg.get("metadata"), dict) else {}
    get = lambda key: cfg.get(key, meta.get(key))  # noqa: E731 - SAELens 6 keeps these in `metadata`
    hook = get("hook_point") or get("hook_name") or folder.name
    base = get("model_name") or _sparsify_run_model(folder)
    point = claimed_point(hook)
    layer = TraceKey.parse(point).layer if point else get("hook_layer")
    return Provenance(format=fmt, d_in=d_in, n_latents=n_latents, k=k, dtype=str(get("dtype") or dtype),
                      folder=folder, hook=str(hook), point=point, layer=layer if isinstance(layer, int) else None,
                      base_model=str(base) if base else None, model_fingerprint=get("model_fingerprint"),
                      positions=get("positions"))


def _sparsify_run_model(folder: Path) -> str | None:
    """sparsify's `RunConfig.model`, from `config.json` in the hook-point folder's parent (a run's folder).
    A Hugging Face model's own `config.json` there is told apart by sparsify's keys (`sae`, `hookpoints`)."""
    run = folder.parent / RUN_CONFIG
    try:
        cfg = json.loads(run.read_text()) if run.is_file() else {}
    except (OSError, ValueError):
        return None
    is_run = isinstance(cfg, dict) and ("sae" in cfg or "hookpoints" in cfg)
    return cfg["model"] if is_run and isinstance(cfg.get("model"), str) else None


def trained_provenance(base: Provenance, origin: dict[str, Any]) -> Provenance:
    """An SAE's provenance `base` after training on a source whose `origin()` is `origin` (point, positions, model)."""
    return replace(base, format="memory", folder=None, hook=origin.get("point"), point=origin.get("point"),
                   layer=TraceKey.parse(origin["point"]).layer if origin.get("point") else None,
                   base_model=origin.get("model_name"), model_fingerprint=origin.get("model_fingerprint"),
                   positions=origin.get("positions"))


def check_sae(model: RewardModel, p: Provenance, key: TraceKey, width: int, *, trust_base_model: bool = False) -> None:
    """Refuse an SAE of provenance `p` at hook point `key` (activations of `width`) of `model` it does not fit.

    Always refused: another width; a claimed layer the model lacks; a claimed hook point of another kind.
    Refused unless `trust_base_model`: another base model (`base_name`s differ), or, for an SAE
    rewardlens trained, another model under the same name (its fingerprint differs). Warned: a
    claimed layer other than `key`'s (the caller named the layer), a stored dtype other than the model's.
    """
    where = f"the SAE in {p.folder or 'memory'}"
    if p.d_in != width:
        raise SAEMismatchError(f"{where} reads vectors of width {p.d_in} but this model's {key} has width {width}; "
                               "it was trained on another model — load the SAE made for this backbone")
    claim = f"{p.point or p.hook} (hook {p.hook!r})"
    if p.layer is not None and not 0 <= p.layer < model.n_layers:
        raise SAEMismatchError(f"{where} was trained at layer {p.layer} ({claim}) but this model has layers "
                               f"0..{model.n_layers - 1}; load the SAE made for this model")
    claimed = TraceKey.parse(p.point) if p.point else None
    if claimed is not None and claimed.kind != key.kind:
        raise SAEMismatchError(f"{where} was trained on {claim} but is applied at {key}; a {claimed.kind} SAE does "
                               f"not read {key.kind} activations — load the SAE trained at {key}")
    if claimed is not None and claimed != key:
        warn(f"{where} is named for {claimed} but is applied at {key} as asked")
    _check_base(model, p, where, trust_base_model)
    dtype = str(next(model.model.parameters()).dtype).removeprefix("torch.")
    if p.format != "memory" and p.dtype != dtype:
        warn(f"{where} was stored in {p.dtype} and the model runs in {dtype}; the SAE is read in fp32, so only "
             "rounding differs, but a different dtype can mean a different copy of the model")


def _check_base(model: RewardModel, p: Provenance, where: str, trust: bool) -> None:
    if trust or p.base_model is None:
        return
    mine = model_name(model)
    fix = ("if this model is a renamed copy or a fine-tune of it, pass trust_base_model=True (CLI: --sae-any-model); "
           "else load the SAE made for this model")
    if base_name(p.base_model) != base_name(mine):
        raise SAEMismatchError(f"{where} was trained on {p.base_model!r} but this model is {mine!r} (compared as "
                               f"{base_name(p.base_model)!r} vs {base_name(mine)!r}); {fix}")
    if p.model_fingerprint is not None and p.model_fingerprint != model_fingerprint(model):
        raise SAEMismatchError(f"{where} was trained on {p.base_model!r} with fingerprint {p.model_fingerprint} but "
                               f"this model's is {model_fingerprint(model)} (other weights under that name); {fix}")
