"""Transcoder sets on disk: rewardlens' own (sparsify's layout), sparsify's, circuit-tracer's; and the check
that a set belongs to the model it is applied to.

- rewardlens / sparsify: one folder per MLP, named for the module (`layers.3.mlp`), holding `cfg.json`
  (sparsify's `SparseCoderConfig`: `transcode: true`, `skip_connection`, `k`, `num_latents`, … and
  `d_in`; rewardlens adds `layer`, `d_out`, `model_name`, `model_fingerprint`, `dtype`, `skip_first`) and
  `sae.safetensors` (`encoder.weight` [d_sae, d_in], `encoder.bias`, `W_dec` [d_sae, d_out], `b_dec`,
  and `W_skip` [d_out, d_in], applied by sparsify as `x W_skipᵀ`). The parent holds sparsify's run
  `config.json` (`model`, `hookpoints`, `sae`), which names the base model.
- circuit-tracer: `layer_<i>.safetensors` per layer (`TranscoderSet.to_safetensors`: `W_enc`
  [d_sae, d_model], `W_dec` [d_sae, d_model], `b_enc`, `b_dec`, optional `W_skip` applied as
  `x W_skipᵀ`, `activation_function.threshold` for JumpReLU, `k` for TopK, else ReLU), with an optional
  `config.yaml` (`model_name`, `feature_input_hook`, `feature_output_hook`, `transcoders`: file paths).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import DataError, SAEMismatchError, warn
from ..model import RewardModel
from ._provenance import RUN_CONFIG, base_name, model_fingerprint, model_name
from ._transcoder import CONFIG, WEIGHTS, Activation, Transcoder, TranscoderConfig, Transcoders

CT_CONFIG = "config.yaml"
_CT_FILE = re.compile(r"layer_(\d+)\.safetensors")
_MODULE = re.compile(r"(?:\w+\.)*?(\d+)\.mlp")
_CT_INPUTS = ("mlp.hook_in", "ln2.hook_normalized", "hook_mlp_in")
"""circuit-tracer input hooks that are the MLP module's own (post-norm) input, as rewardlens' `mlp_in`."""
_CT_OUTPUTS = ("mlp.hook_out", "hook_mlp_out")


def _dtype_name(t: Tensor | torch.dtype) -> str:
    return str(t if isinstance(t, torch.dtype) else t.dtype).removeprefix("torch.")


def load_transcoder_folder(folder: Path, *, layers: list[int] | None = None, device: torch.device | str = "cpu",
                           dtype: torch.dtype = torch.float32) -> Transcoders:
    """Read every (or each of `layers`) transcoder under `folder`, in whichever format it is (module docstring)."""
    if not folder.is_dir():
        raise DataError(f"transcoder folder {folder} does not exist; pass the folder `rewardlens transcoders train` "
                        "wrote, a sparsify run folder or a circuit-tracer folder of layer_<i>.safetensors")
    subs = sorted(p for p in folder.iterdir() if (p / CONFIG).is_file() and (p / WEIGHTS).is_file())
    if subs:
        found = {_sparsify_layer(p): p for p in subs}
        fmt = "rewardlens" if any("layer" in json.loads((p / CONFIG).read_text()) for p in subs) else "sparsify"
        run_model = _run_model(folder)
        chosen = _choose(found, layers, folder)
        loaded = {layer: _load_sparsify(p, layer, run_model, device, dtype) for layer, p in chosen.items()}
        return Transcoders(loaded, format=fmt, folder=folder)
    files, meta = _circuit_tracer_files(folder)
    if files:
        chosen = _choose(files, layers, folder)
        loaded = {layer: _load_circuit_tracer(p, layer, meta, device, dtype) for layer, p in chosen.items()}
        return Transcoders(loaded, format="circuit-tracer", folder=folder)
    raise DataError(f"{folder} holds no transcoder: expected subfolders with {CONFIG} + {WEIGHTS} (rewardlens, "
                    f"sparsify) or layer_<i>.safetensors files (circuit-tracer)")


def _choose(found: dict[int, Path], layers: list[int] | None, folder: Path) -> dict[int, Path]:
    if layers is None:
        return dict(sorted(found.items()))
    missing = [layer for layer in layers if layer not in found]
    if missing:
        raise SAEMismatchError(f"{folder} has no transcoder for layer(s) {missing}; it covers {sorted(found)} — "
                               "train those layers or drop them from layers=")
    return {layer: found[layer] for layer in layers}


def _sparsify_layer(sub: Path) -> int:
    cfg = json.loads((sub / CONFIG).read_text())
    if isinstance(cfg.get("layer"), int):
        return int(cfg["layer"])
    m = _MODULE.fullmatch(sub.name)
    if m is None:
        raise DataError(f"{sub}: a sparsify transcoder folder is named for its MLP module (e.g. layers.3.mlp), got "
                        f"{sub.name!r}; rename it so its layer can be read")
    return int(m[1])


def _run_model(folder: Path) -> str | None:
    run = folder / RUN_CONFIG
    try:
        cfg = json.loads(run.read_text()) if run.is_file() else {}
    except ValueError:
        return None
    return cfg["model"] if isinstance(cfg, dict) and isinstance(cfg.get("model"), str) and cfg["model"] else None


def _load_sparsify(sub: Path, layer: int, run_model: str | None, device: torch.device | str,
                   dtype: torch.dtype) -> Transcoder:
    from safetensors.torch import load_file

    cfg = json.loads((sub / CONFIG).read_text())
    if not cfg.get("transcode"):
        raise SAEMismatchError(f"{sub / CONFIG} has transcode={cfg.get('transcode')!r}: it is an autoencoder, not a "
                               "transcoder — load it with rewardlens.sae.load_sae")
    t = load_file(str(sub / WEIGHTS))
    need = ("encoder.weight", "encoder.bias", "W_dec", "b_dec")
    if any(k not in t for k in need):
        raise DataError(f"{sub / WEIGHTS} lacks {[k for k in need if k not in t]} (holds {sorted(t)})")
    d_sae, d_in = t["encoder.weight"].shape
    d_out = t["b_dec"].shape[0]
    activation: Activation = "jumprelu" if "threshold" in t else cfg.get("activation", "topk")
    if activation not in ("topk", "relu", "jumprelu"):
        raise SAEMismatchError(f"{sub / CONFIG}: activation {activation!r} is not read; rewardlens reads TopK, "
                               "ReLU and JumpReLU transcoders")
    if cfg.get("skip_connection") != ("W_skip" in t):
        raise DataError(f"{sub}: cfg.json says skip_connection={cfg.get('skip_connection')!r} but the weights "
                        f"{'hold' if 'W_skip' in t else 'lack'} W_skip; the folder is inconsistent")
    k = int(cfg.get("k", d_sae)) if activation == "topk" else int(d_sae)
    tc_cfg = TranscoderConfig(layer=layer, d_in=int(d_in), d_out=int(d_out), d_sae=int(d_sae), k=k,
                              skip="W_skip" in t, base_model=cfg.get("model_name") or run_model,
                              dtype=str(cfg.get("dtype") or _dtype_name(t["W_dec"])), activation=activation,
                              model_fingerprint=cfg.get("model_fingerprint"), skip_first=cfg.get("skip_first"))
    state = {"W_enc": t["encoder.weight"].T, "b_enc": t["encoder.bias"], "W_dec": t["W_dec"], "b_dec": t["b_dec"]}
    if "W_skip" in t:
        state["W_skip"] = t["W_skip"].T
    if "threshold" in t:
        state["threshold"] = t["threshold"]
    return _assign(tc_cfg, state, sub / WEIGHTS, device, dtype)


def _assign(cfg: TranscoderConfig, state: dict[str, Tensor], file: Path, device: torch.device | str,
            dtype: torch.dtype) -> Transcoder:
    tc = Transcoder(cfg, device="meta")
    expected = {k: tuple(v.shape) for k, v in tc.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state.items()}
    if expected != found:
        raise DataError(f"{file}: tensor shapes {found} do not fit one transcoder of d_in={cfg.d_in}, "
                        f"d_sae={cfg.d_sae}, d_out={cfg.d_out} (expected {expected})")
    tc.load_state_dict({k: v.to(device=device, dtype=dtype).contiguous() for k, v in state.items()}, assign=True)
    return tc


def _circuit_tracer_files(folder: Path) -> tuple[dict[int, Path], dict[str, Any]]:
    meta: dict[str, Any] = {}
    if (folder / CT_CONFIG).is_file():
        import yaml

        meta = yaml.safe_load((folder / CT_CONFIG).read_text()) or {}
        for key, allowed in (("feature_input_hook", _CT_INPUTS), ("feature_output_hook", _CT_OUTPUTS)):
            hook = meta.get(key)
            if hook is not None and hook not in allowed:
                raise SAEMismatchError(f"{folder / CT_CONFIG}: {key}={hook!r}; rewardlens' transcoders read the MLP "
                                       f"module's input and write its output ({allowed}) — these do not")
        paths = meta.get("transcoders")
        if isinstance(paths, list):
            out = {}
            for i, p in enumerate(paths):
                if str(p).startswith("hf://"):
                    raise DataError(f"{folder / CT_CONFIG} names {p!r}; rewardlens never downloads — fetch the file "
                                    "and list its local path")
                path = Path(p) if Path(p).is_absolute() else folder / p
                if not path.is_file():
                    raise DataError(f"{folder / CT_CONFIG} lists {p!r} for layer {i} but {path} does not exist")
                m = _CT_FILE.fullmatch(path.name)  # a partial set keeps its layer in the file name
                out[int(m[1]) if m else i] = path
            return out, meta
    files = {int(m[1]): p for p in folder.iterdir() if (m := _CT_FILE.fullmatch(p.name))}
    return files, meta


def _load_circuit_tracer(file: Path, layer: int, meta: dict[str, Any], device: torch.device | str,
                         dtype: torch.dtype) -> Transcoder:
    from safetensors.torch import load_file

    t = load_file(str(file))
    need = ("W_enc", "W_dec", "b_enc", "b_dec")
    if any(k not in t for k in need):
        raise DataError(f"{file} lacks {[k for k in need if k not in t]} (holds {sorted(t)}); it is not a "
                        "circuit-tracer transcoder")
    d_sae, d_in = t["W_enc"].shape
    if "activation_function.threshold" in t:
        activation: Activation = "jumprelu"
        k = int(d_sae)
    elif "k" in t:
        activation, k = "topk", int(t["k"].item())
    else:
        activation, k = "relu", int(d_sae)
    base = meta.get("model_name")
    tc_cfg = TranscoderConfig(layer=layer, d_in=int(d_in), d_out=int(t["b_dec"].shape[0]), d_sae=int(d_sae), k=k,
                              skip="W_skip" in t, base_model=str(base) if base else None,
                              dtype=_dtype_name(t["W_dec"]), activation=activation)
    state = {"W_enc": t["W_enc"].T, "b_enc": t["b_enc"], "W_dec": t["W_dec"], "b_dec": t["b_dec"]}
    if "W_skip" in t:
        state["W_skip"] = t["W_skip"].T
    if activation == "jumprelu":
        state["threshold"] = t["activation_function.threshold"]
    return _assign(tc_cfg, state, file, device, dtype)


def save_circuit_tracer(tcs: Transcoders, folder: Path, *, model: str | None = None) -> Path:
    """Write `tcs` as circuit-tracer's `TranscoderSet.to_safetensors` does, with a `config.yaml` naming the
    hooks (`mlp.hook_in` → `mlp.hook_out`) and the base model."""
    import yaml
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for layer, tc in tcs.items():
        cpu = lambda t: t.detach().contiguous().cpu()  # noqa: E731
        state = {"W_enc": cpu(tc.W_enc.T), "W_dec": cpu(tc.W_dec), "b_enc": cpu(tc.b_enc), "b_dec": cpu(tc.b_dec)}
        if tc.W_skip is not None:
            state["W_skip"] = cpu(tc.W_skip.T)
        if tc.cfg.activation == "topk":
            state["k"] = torch.tensor(tc.k)
        elif tc.threshold is not None:
            state["activation_function.threshold"] = cpu(tc.threshold)
        names.append(f"layer_{layer}.safetensors")
        save_file(state, str(folder / names[-1]))
    meta = {"model_name": model or tcs.provenance.base_model or "", "feature_input_hook": "mlp.hook_in",
            "feature_output_hook": "mlp.hook_out", "scan": "rewardlens", "transcoders": names}
    (folder / CT_CONFIG).write_text(yaml.safe_dump(meta))
    return folder


def check_transcoders(model: RewardModel, tcs: Transcoders, layers: list[int] | tuple[int, ...] | None = None, *,
                      trust_base_model: bool = False) -> None:
    """Refuse a set that does not fit `model`: another width, a layer the model lacks or that the set lacks,
    another base model or (for sets rewardlens trained) other weights under the same name. Warn on dtype."""
    p, where = tcs.provenance, f"the transcoders in {tcs.provenance.folder or 'memory'}"
    outs = {tc.cfg.d_out for tc in tcs.values()}
    if p.d_in != model.d_model or outs != {model.d_model}:
        raise SAEMismatchError(f"{where} read width {p.d_in} and write {sorted(outs)} but this model's MLPs are "
                               f"{model.d_model} wide; they were trained on another model — load its own transcoders")
    bad = [layer for layer in p.layers if not 0 <= layer < model.n_layers]
    if bad:
        raise SAEMismatchError(f"{where} replace layer(s) {bad} but this model has layers 0..{model.n_layers - 1}; "
                               "load the transcoders made for this model")
    if layers is not None:
        tcs.require(layers)
    fix = ("if this model is a renamed copy or a fine-tune of it, pass trust_base_model=True; else load the "
           "transcoders made for this model")
    mine = model_name(model)
    if not trust_base_model and p.base_model and base_name(p.base_model) != base_name(mine):
        raise SAEMismatchError(f"{where} were trained on {p.base_model!r} but this model is {mine!r}; {fix}")
    if not trust_base_model and p.model_fingerprint and p.model_fingerprint != model_fingerprint(model):
        raise SAEMismatchError(f"{where} were trained on {p.base_model!r} with fingerprint {p.model_fingerprint} "
                               f"but this model's is {model_fingerprint(model)}; {fix}")
    mine_dtype = _dtype_name(next(model.model.parameters()).dtype)
    if p.format != "memory" and p.dtype != mine_dtype:
        warn(f"{where} were stored in {p.dtype} and the model runs in {mine_dtype}; only rounding differs if they "
             "belong to this model")


def config_dict(cfg: TranscoderConfig) -> dict[str, Any]:
    """The config as a plain dict (for reports)."""
    return asdict(cfg)


def load_transcoders(folder: str | Path, *, layers: list[int] | None = None, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32) -> Transcoders:
    """Read a transcoder set: rewardlens'/sparsify's per-layer folders or circuit-tracer's per-layer files."""
    return load_transcoder_folder(Path(folder), layers=layers, device=device, dtype=dtype)
