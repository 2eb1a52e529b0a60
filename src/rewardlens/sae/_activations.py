"""Activations for SAEs: streamed from a reward model at a hook point, or from a safetensors shard cache.

A source yields `Activations` chunks (one model batch, or one shard) and can be iterated again
(each pass reruns the model, or rereads the shards); nothing ever holds the whole set. Hook points
are trace keys (`TraceKey.resid(l)`, or its string form `resid_{l}`, parsed here: the boundary; also
`attn_{l}`, `mlp_{l}`, `attn_z_{l}`, `mlp_act_{l}`, `embed`, `final`), read at the read position `t*`
('read') or at every non-pad token ('all').
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data import Inputs
from ..data.internal import progress_bar
from ..errors import ArchitectureError, DataError, SAEMismatchError, UsageError
from ..model import RewardModel, TraceKey, TraceKind
from ..model.internal import Batch, Point, points, projection_inputs, rewriting
from ..types import SaePositions
from ._autoencoder import CONFIG, TopKSAE, sae_folders
from ._provenance import check_sae, model_fingerprint, model_identity, model_name

POSITIONS = ("read", "all")
CACHE_FORMAT = "rewardlens-activations-v1"
HOOK_KINDS: tuple[TraceKind, ...] = ("embed", "final", "resid", "attn", "mlp", "attn_z", "mlp_act")
"""The trace points an SAE can read (not the post-norm residual norms' inputs, nor a gated head's gate)."""


@dataclass(frozen=True)
class Activations:
    """A chunk of activations `x` [m, d] (fp32) with the input index `seq` [m] and token `pos` [m] of each row."""

    x: Tensor
    seq: Tensor
    pos: Tensor


def _hook_key(name: str) -> TraceKey | None:
    """The hook point a string names (`'resid_3'`), or None when it names none an SAE reads."""
    try:
        key = TraceKey.parse(name)
    except ValueError:
        return None
    return key if key.kind in HOOK_KINDS else None


def check_point(model: RewardModel, point: TraceKey | str) -> TraceKey:
    """The hook point `point` names (a `TraceKey`, or its string form, parsed here); refuses one the model
    does not have."""
    if not isinstance(point, (TraceKey, str)):
        raise TypeError(f"a hook point is a TraceKey or its name, such as 'resid_3'; got {type(point).__name__}")
    key = _hook_key(point) if isinstance(point, str) else point if point.kind in HOOK_KINDS else None
    if key is None or (key.layer is not None and key.layer >= model.n_layers):
        raise ArchitectureError(
            f"the model has no hook point {str(point)!r}; it has embed, final and, for layers 0..{model.n_layers - 1}, "
            "resid_{l} (a layer's output: the residual stream), attn_{l}, mlp_{l}, attn_z_{l}, mlp_act_{l}"
        )
    return key


def point_width(model: RewardModel, point: TraceKey | str) -> int:
    """Width of the activations at hook point `point`."""
    key = check_point(model, point)
    if key.kind in ("attn_z", "mlp_act"):
        assert key.layer is not None  # these kinds always carry a layer (TraceKey checks it)
        return projection_inputs(model, "attn" if key.kind == "attn_z" else "mlp", key.layer)[0]
    return model.d_model


def hookpoint(model: RewardModel, point: TraceKey | str) -> str:
    """The SAE folder name for `point` (a `TraceKey` or its name): sparsify's module path from `base_model`
    for a layer's output (`layers.3` for Llama, `encoder.layer.3` for BERT, `h.3` for GPT-2), else the
    point's name (`mlp_3`)."""
    key = check_point(model, point)
    if key.kind != "resid":
        return key.name
    prefix, path = getattr(model.model, "base_model_prefix", ""), model.arch.layers
    rel = path[len(prefix) + 1:] if prefix and path.startswith(prefix + ".") else path
    return f"{rel}.{key.layer}"


def point_of_folder(model: RewardModel, name: str) -> TraceKey | None:
    """The hook point an SAE folder name stands for (`layers.3` or `resid_3` → `TraceKey.resid(3)`), or None."""
    for layer in range(model.n_layers):
        key = TraceKey.resid(layer)
        if name in (key.name, hookpoint(model, key)):
            return key
    return _hook_key(name)


def point_at(model: RewardModel, key: TraceKey, batch: Batch) -> Point:
    """Where hook point `key` lies in the model for `batch` (its module, input or output, read position)."""
    heads = [key.layer] if key.kind == "attn_z" and key.layer is not None else []
    neurons = [key.layer] if key.kind == "mlp_act" and key.layer is not None else []
    return points(model, batch, heads=heads, neurons=neurons, gate=False)[key]


def skip_first_for(model: RewardModel, skip_first: int | None = None, transcoders: Any = None) -> int:
    """How many tokens at each sequence's start SAEs and transcoders leave out — in training, in fidelity, and
    where attribution graphs keep the MLP whole (graphs/_basis.py): `skip_first` if given, else what the
    `transcoders`' training recorded (`TranscoderConfig.skip_first`; the largest if layers differ), else 1 for
    decoders (the first token is an attention sink whose residual norm is ~100× the others) and 0 for encoders
    (the first token is the one the head reads). The one owner of that default."""
    if skip_first is None and transcoders is not None and hasattr(transcoders, "values"):
        found = (getattr(getattr(tc, "cfg", None), "skip_first", None) for tc in transcoders.values())
        recorded = [int(s) for s in found if s is not None]
        skip_first = max(recorded) if recorded else None
    skip = (0 if model.encoder else 1) if skip_first is None else skip_first
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise UsageError(f"skip_first must be a count of tokens >= 0 (or None for the default: 1 on decoders, 0 "
                         f"on encoders), got {skip_first!r}", option="skip_first")
    return skip


def token_mask(batch: Batch, skip_first: int) -> Tensor:
    """The positions positions='all' reads [b, T] (bool): every non-pad token but each sequence's first `skip_first`."""
    return batch.attention_mask.bool() & (batch.position_ids >= skip_first)


@contextlib.contextmanager
def _capture_tokens(point: Point, mask: Tensor, out: list[Tensor]) -> Iterator[None]:
    """Record the point's value at every position where `mask` is set, in fp32; hook always removed."""
    keep = mask.bool()

    def grab(value: Tensor) -> None:
        out.append(value[keep.to(value.device)].detach().float().to(mask.device))

    with rewriting([(point.module, point.where, grab)]):
        yield


class ActivationSource:
    """Activations of `model` at hook point `point` (a `TraceKey`, or its name such as `'resid_3'`) over
    `inputs`, one model batch at a time.

    `inputs`: strings, chat conversations or Pairs (rows interleave chosen, rejected). Tokenized
    once here; every iteration reruns the model (`n_rows` activations of width `d_in`).
    `skip_first` (positions='all'): leave out each sequence's first tokens. Default: 1 for
    decoders, whose first token is an attention sink with a residual norm ~100× the others
    (95% of the variance at SmolLM2's middle layer) that would swamp the SAE's loss; 0 for
    encoders, whose first token is the one the head reads. `progress`: a tqdm bar on stderr over the
    sequences of each pass.
    """

    def __init__(self, model: RewardModel, inputs: Inputs, point: TraceKey | str, *, positions: SaePositions = "read",
                 batch_size: int = 8, skip_first: int | None = None, progress: bool = False) -> None:
        if positions not in POSITIONS:
            raise UsageError(f"positions must be one of {POSITIONS}, got {positions!r}", option="positions")
        self.skip_first = skip_first_for(model, skip_first)
        self.point = check_point(model, point)  # a user's string becomes a TraceKey here, once
        self.model, self.positions, self.batch_size = model, positions, batch_size
        self.progress = progress
        self.d_in = point_width(model, self.point)
        self.seqs, self.is_pairs = model.encode(inputs)
        self.n_rows = (len(self.seqs) if positions == "read"
                       else sum(max(len(s.ids) - self.skip_first, 0) for s in self.seqs))

    def tokens(self, seq: int) -> list[int]:
        return self.seqs[seq].ids

    def fingerprint(self) -> str:
        """Identifies what this source yields: model (name, shape and a checksum of its head, which
        tells fine-tunes saved under one path apart), point, positions and every token id."""
        h = hashlib.sha256()
        h.update(json.dumps([*model_identity(self.model), self.point.name, self.positions,
                             self.skip_first]).encode())
        for s in self.seqs:
            h.update(json.dumps(s.ids).encode())
        return h.hexdigest()[:16]

    def origin(self) -> dict[str, Any]:
        """What an SAE trained on this source records (`Provenance`): point, positions, model name and fingerprint."""
        return {"point": self.point.name, "positions": self.positions, "model_name": model_name(self.model),
                "model_fingerprint": model_fingerprint(self.model)}

    def __iter__(self) -> Iterator[Activations]:
        model = self.model
        with progress_bar(len(self.seqs), f"sae: activations at {self.point}", self.progress, unit="seq") as bar:
            for rows, batch in model.batches(self.seqs, self.batch_size, is_pairs=self.is_pairs):
                pt = point_at(model, self.point, batch)
                rows_t = torch.as_tensor(rows, dtype=torch.long)
                bar.update(len(rows))
                if self.positions == "read":
                    x = model.run(batch, {self.point: pt})[self.point]
                    pos = batch.position_ids.gather(1, batch.read_index[:, None])[:, 0].cpu()
                    yield Activations(x, rows_t, pos)
                    continue
                mask = token_mask(batch, self.skip_first)
                got: list[Tensor] = []
                with _capture_tokens(pt, mask, got):
                    model.run(batch, {})
                seq = rows_t.repeat_interleave(mask.sum(1).cpu())
                yield Activations(got[0], seq, batch.position_ids[mask].cpu())


class ShardedActivations:
    """Activations cached on disk as safetensors shards (`x`, `seq`, `pos`), read one shard at a time."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        index = self.folder / "index.json"
        if not index.is_file():
            raise DataError(f"{self.folder} is not an activation cache (no index.json); "
                            "write one with cache_activations")
        try:
            meta = json.loads(index.read_text(encoding="utf-8"))
        except ValueError as e:  # JSON or UTF-8: a damaged cache is bad input, not a bug
            raise DataError(f"{index} is not valid JSON ({e}); write the cache again with cache_activations") from None
        if meta.get("format") != CACHE_FORMAT:
            raise DataError(f"{index} has format {meta.get('format')!r}, expected {CACHE_FORMAT!r}")
        self.meta = meta
        self.positions = meta["positions"]
        try:
            self.point = TraceKey.parse(meta["point"])  # the stored file holds the string form
        except (TypeError, ValueError) as exc:
            raise DataError(f"{index} names no hook point ({exc}); delete the folder to rebuild it") from None
        self.d_in, self.n_rows = meta["d_in"], meta["n_rows"]
        missing = [s["file"] for s in meta["shards"] if not (self.folder / s["file"]).is_file()]
        if missing:
            raise DataError(f"activation cache {self.folder} lacks shards {missing[:3]}; "
                            "delete the folder to rebuild it")

    def origin(self) -> dict[str, Any]:
        """`ActivationSource.origin` of the source cached (the model's name and fingerprint: caches written since
        they were recorded)."""
        return {"point": self.point.name, "positions": self.positions, "model_name": self.meta.get("model_name"),
                "model_fingerprint": self.meta.get("model_fingerprint")}

    def __iter__(self) -> Iterator[Activations]:
        from safetensors.torch import load_file

        for shard in self.meta["shards"]:
            t = load_file(str(self.folder / shard["file"]))
            yield Activations(t["x"].float(), t["seq"], t["pos"])


def cache_activations(source: ActivationSource, folder: str | Path, *, rows_per_shard: int = 1 << 16,
                      dtype: torch.dtype = torch.float32) -> ShardedActivations:
    """Write `source` to `folder` as shards of `rows_per_shard` rows, or reuse a cache of the same source.

    The index (point, positions, width, rows, a fingerprint of model and tokens) is written last,
    so an interrupted write is never mistaken for a cache. A cache of another source is refused.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    fingerprint = source.fingerprint()
    if (folder / "index.json").is_file():
        cache = ShardedActivations(folder)
        if cache.meta.get("fingerprint") != fingerprint:
            raise DataError(
                f"activation cache {folder} was written for another model, hook point or input set "
                f"({cache.point}, {cache.positions}); delete it or pass another cache folder"
            )
        return cache
    folder.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, Any]] = []
    pending: list[Activations] = []

    def flush() -> None:
        if not pending:
            return
        name = f"shard_{len(shards):05d}.safetensors"
        save_file({"x": torch.cat([a.x for a in pending]).to(dtype).cpu().contiguous(),
                   "seq": torch.cat([a.seq for a in pending]).contiguous(),
                   "pos": torch.cat([a.pos for a in pending]).contiguous()}, str(folder / name))
        shards.append({"file": name, "rows": sum(len(a.seq) for a in pending)})
        pending.clear()

    for chunk in source:
        while len(chunk.seq):
            room = rows_per_shard - sum(len(a.seq) for a in pending)
            pending.append(Activations(chunk.x[:room], chunk.seq[:room], chunk.pos[:room]))
            chunk = Activations(chunk.x[room:], chunk.seq[room:], chunk.pos[room:])
            if sum(len(a.seq) for a in pending) >= rows_per_shard:
                flush()
    flush()
    meta = {"format": CACHE_FORMAT, "point": source.point.name, "positions": source.positions, "d_in": source.d_in,
            "n_rows": sum(s["rows"] for s in shards), "dtype": str(dtype).removeprefix("torch."),
            "fingerprint": fingerprint, "shards": shards, "model_name": model_name(source.model),
            "model_fingerprint": model_fingerprint(source.model)}
    (folder / "index.json").write_text(json.dumps(meta, indent=1))
    return ShardedActivations(folder)


def shuffled(chunks: Iterable[Activations], batch_size: int, buffer_rows: int, gen: torch.Generator,
             device: torch.device | None = None) -> Iterator[Tensor]:
    """Training batches [≤ batch_size, d] drawn at random from a buffer of about `buffer_rows` rows.

    Model batches are length-sorted and tokens of one sequence are alike; mixing them in a buffer
    decorrelates consecutive optimizer steps while memory stays at `buffer_rows × d`.
    """
    buf: list[Tensor] = []
    held = 0
    for chunk in chunks:
        buf.append(chunk.x if device is None else chunk.x.to(device))
        held += len(chunk.x)
        if held < buffer_rows:
            continue
        x = torch.cat(buf)
        x = x[torch.randperm(len(x), generator=gen).to(x.device)]
        n_full = len(x) // batch_size * batch_size
        yield from x[:n_full].split(batch_size)
        buf, held = [x[n_full:]], len(x) - n_full
    if held:
        x = torch.cat(buf)
        yield from x[torch.randperm(len(x), generator=gen).to(x.device)].split(batch_size)


def load_sae_for(model: RewardModel, path: str | Path, layer: int | None = None, *,
                 trust_base_model: bool = False) -> tuple[TopKSAE, int]:
    """Load the SAE of `model`'s residual after `layer` from a folder or a parent of hook-point folders,
    checked against the model (`check_sae`: width, hook point, dtype, base model).

    With `layer`, the folder is `path` itself or `path/<hook point>` (sparsify's `layers.3` or
    `resid_3`); without, the layer is the one the folder claims (SAELens' `hook_name`, rewardlens'
    `hook_point`, else the folder's name). `trust_base_model`: accept an SAE whose recorded base model
    is not this model's name (a renamed local copy, or a fine-tune of the SAE's model).
    """
    path = Path(path)
    if layer is not None:
        key = check_point(model, TraceKey.resid(layer))
        names = [hookpoint(model, key), key.name]
        found = None if (path / CONFIG).is_file() else next((n for n in names if (path / n / CONFIG).is_file()), None)
        if found is None and not (path / CONFIG).is_file():
            raise DataError(f"{path} has no SAE folder for layer {layer} ({' or '.join(names)}); "
                            f"it holds {sae_folders(path)}")
        sae = TopKSAE.load(path if found is None else path / found)
    else:
        sae = TopKSAE.load(path)
        key = _claimed_resid(model, sae)
        layer = key.layer
        assert layer is not None  # a resid key always has its layer
    check_sae(model, sae.provenance, key, model.d_model, trust_base_model=trust_base_model)
    return sae, layer


def _claimed_resid(model: RewardModel, sae: TopKSAE) -> TraceKey:
    """The residual hook point a loaded SAE claims: its provenance's point, else its folder's sparsify name."""
    assert sae.folder is not None  # TopKSAE.load records the folder
    p = sae.provenance
    point = TraceKey.parse(p.point) if p.point else point_of_folder(model, sae.folder.name)
    if point is not None and point.kind == "resid" and point.layer is not None:
        return TraceKey.resid(point.layer)
    if point is not None:
        raise SAEMismatchError(f"the SAE in {sae.folder} was trained on {point} (hook {p.hook!r}); load_sae_for "
                               "applies SAEs to the residual stream (resid_{l}) only — load the residual SAE")
    raise DataError(
        f"cannot tell which layer the SAE folder {sae.folder} belongs to from its name {sae.folder.name!r}; "
        f"name the layer (layer= or --layer), or name the folder {hookpoint(model, 'resid_0')!r}-style", option="layer"
    )
