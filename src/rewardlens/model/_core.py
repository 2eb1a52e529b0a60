"""`RewardModel`: a Hugging Face reward model, its tokenizer, its map and an fp32 head."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast, get_args

import numpy as np
from torch import Tensor, nn

from ..errors import ArchitectureError, HeadError, TokenizationError, UsageError, warn
from ..types import PaddingSide, Readout, Truncation
from ._arch import ArchitectureMap, check_position_pad, find_map, get_module, hf_config, position_limit, text_config
from ._armorm import gate_positions
from ._hooks import Point, PointKey
from ._keys import TraceKey
from ._kind import CLASSIFIER, Offsets, RewardKind
from ._norms import NormParams
from ._oom import batch_loop, run_rows
from ._pair_tokens import CheckedPairs
from ._placement import execution_device, onloaded, remove_dispatch_hooks
from ._reading import Reading, Sink, read_loop
from ._readout import Head
from ._reads import READ_LAST, Reads, one_read_only
from ._tokens import (
    Batch,
    Tokenized,
    TokenMemo,
    collate,
    fit_length,
    fits_length,
    flatten_inputs,
    judge_question,
    sequence_label,
    tokenize,
    warn_encoded,
    warn_pad_is_eos,
    with_reads,
)
from ._vocab import check_vocabulary

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..data import Inputs, Pair
    from ..types import Text

TRUNCATIONS: tuple[Truncation, ...] = get_args(Truncation)


class Unset(enum.Enum):
    """The type of `UNSET`: "not given", where None is a value (`pad_token_id=None`: no pad id)."""

    UNSET = "UNSET"


UNSET = Unset.UNSET


class RewardModel:
    """A sequence-classification reward model prepared for exact read-outs.

    Holds the user's model untouched (only hooks, always removed), an fp32 copy of the head, the
    architecture map and the tokenization rules. Build it with `rewardlens.load` or `from_model`.
    `kind` declares which kind of reward model it is (`RewardKind`, built by the loaders).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        arch: ArchitectureMap,
        *,
        readout: Readout = None,
        pad_token_id: int | None | Unset = UNSET,
        max_length: int | None = None,
        truncation: Truncation = "error",
        reads: Reads = READ_LAST,
        head: Head | None = None,
        kind: RewardKind[RewardModel] = CLASSIFIER,
        source: str | None = None,
    ) -> None:
        if truncation not in TRUNCATIONS:
            raise UsageError(f"truncation must be 'error' or 'left', got {truncation!r}", option="truncation")
        self.model, self.tokenizer, self.arch = model, tokenizer, arch
        self.truncation, self._memo, self._checked = truncation, TokenMemo(), CheckedPairs()
        self.encoder = arch.pooling == "first"
        self.device = execution_device(model, get_module(model, arch.head))
        with onloaded(*(get_module(model, p) for p in (arch.head, arch.pooler, arch.gate) if p)):
            self.head = head if head is not None else Head.from_model(model, arch, readout, self.device)
        if reads.multi and (self.encoder or arch.head_kind != "linear"):
            raise HeadError("multi-position read-outs are for decoders with a linear head (not a pooler or a gate)")
        self.reads = reads
        """Where the reward is read (one token, or a set of positions combined: model/_reads.py)."""
        kind.check_model(reads, self.head)
        self._kind = kind
        self.source = source
        """What results name the model by (audit provenance): `load`'s path or hub id, None for `wrap`."""
        if self.head.gating is not None:  # a copy of the user's gate: it must stay ours
            remove_dispatch_hooks(self.head.gating, self.device)
        config_pad = getattr(text_config(model), "pad_token_id", None)
        # The model's own pooling uses config.pad_token_id; reading by the same rule keeps scores equal.
        self.pad_token_id: int | None = config_pad if pad_token_id is UNSET else pad_token_id
        check_vocabulary(model, tokenizer, self.pad_token_id, pad_given=pad_token_id is not UNSET, source=source)
        if self.pad_token_id is None and not self.encoder:
            warn(
                "the model has no pad token, so its own forward cannot score batches; rewardlens pads "
                "under the attention mask and reads the last real token, as the model does on one "
                "unpadded input. Pass pad_token_id= to rewardlens.load to read by a pad id instead."
            )
        check_position_pad(arch, config_pad, self.pad_token_id)
        self.max_length: int | None = max_length if max_length is not None else position_limit(model, arch)
        params = inspect.signature(self.backbone.forward).parameters.values()
        self._forward_args = {p.name for p in params}
        # A forward that takes **kwargs still needs real position ids under left padding.
        if any(p.kind is p.VAR_KEYWORD for p in params):
            self._forward_args |= {"position_ids", "use_cache"}
        if arch.position_ids == "model":  # the model numbers positions from the pad id itself
            self._forward_args.discard("position_ids")
        self._norms: dict[str, NormParams] = {}
        self.verified = False
        """Set once `rewardlens.model.verify` has proven the map on this model."""

    @classmethod
    def from_model(
        cls, model: nn.Module, tokenizer: PreTrainedTokenizerBase, *, arch: ArchitectureMap | None = None,
        readout: Readout = None, pad_token_id: int | None | Unset = UNSET, max_length: int | None = None,
        truncation: Truncation = "error",
    ) -> RewardModel:
        """Wrap an already loaded model (never modified); `arch` defaults to the registry/discovery.

        This does not yet prove the map fits: `rewardlens.wrap` does, and so does the first
        decomposition. Prefer `rewardlens.wrap` (or `rewardlens.load`).
        """
        return cls(model, tokenizer, arch or find_map(model), readout=readout, pad_token_id=pad_token_id,
                   max_length=max_length, truncation=truncation)

    # ---- the kind: read-only, declared at construction ------------------------------------------
    @property
    def kind(self) -> RewardKind[RewardModel]:
        """Which kind of reward model this is, and what defines it (frozen; built by the loaders)."""
        return self._kind

    @property
    def offsets(self) -> Offsets | None:
        """A constant per read, from the sequences (a DPO reference's term, `reference_term='constant'`)."""
        return self._kind.offsets

    @property
    def judge(self) -> str | None:
        """An LLM judge's question, with {prompt} and {response}: each input is asked it (`load_judge`)."""
        return self._kind.question

    @property
    def reference(self) -> RewardModel | None:
        """A DPO reward's reference, read the same way (`rewardlens.model.load_dpo`), else None."""
        return self._kind.reference

    # ---- structure ----------------------------------------------------------------------------
    @cached_property
    def backbone(self) -> nn.Module:
        return cast(nn.Module, self.model.base_model)  # a Hugging Face model's backbone

    @cached_property
    def layers(self) -> nn.ModuleList:
        return cast(nn.ModuleList, get_module(self.model, self.arch.layers))  # the map names a ModuleList

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_heads(self) -> int:
        return int(text_config(self.model).num_attention_heads)

    @property
    def d_model(self) -> int:
        return int(self.head.weight.shape[1] if self.head.pooler_weight is None else self.head.pooler_weight.shape[1])

    def layer_module(self, layer: int, path: str) -> nn.Module:
        return get_module(self.layers[layer], path)

    def norm(self, path: str, layer: int | None = None) -> NormParams:
        """fp32 parameters of the norm at `path` (relative to layer `layer` if given), cached."""
        key = path if layer is None else f"{layer}:{path}"
        if key not in self._norms:
            module = get_module(self.model, path) if layer is None else self.layer_module(layer, path)
            with onloaded(module):
                self._norms[key] = NormParams.from_module(module, self.arch.norm).to(self.device)
        return self._norms[key]

    # ---- tokens and batches -------------------------------------------------------------------
    def encode(self, inputs: Inputs | Text | Pair) -> tuple[list[Tokenized], bool]:
        """Token ids of every sequence (pairs interleaved chosen, rejected) and whether inputs were pairs."""
        seqs, is_pairs = self._read_positions(inputs)
        self._checked.check(self, inputs if is_pairs else None, seqs)  # token checks of pairs, before any forward
        if self.offsets is not None:
            seqs = [replace(s, offsets=o) for s, o in zip(seqs, self.offsets(seqs))]
        if not self.encoder and not self.reads.multi:  # a set of reads has explicit positions: no pad rule
            warn_pad_is_eos(self.tokenizer, seqs, self.pad_token_id)
        warn_encoded(self.tokenizer, seqs)
        return seqs, is_pairs

    def _read_positions(self, inputs: Inputs | Text | Pair) -> tuple[list[Tokenized], bool]:
        """`encode` before any offset or warning: token ids, fitted to length, with their reads."""
        items, is_pairs = flatten_inputs(inputs)
        items = [self.as_read(item) for item in items]
        seqs = [
            fit_length(self.tokenize(item), sequence_label(i, is_pairs), self.max_length, self.truncation,
                       self.encoder)
            for i, item in enumerate(items)
        ]
        empty = [sequence_label(i, is_pairs) for i, s in enumerate(seqs) if not s.ids]
        if empty:
            raise TokenizationError(f"{empty[0]} tokenized to zero tokens; there is nothing to read")
        if self.reads.multi:
            seqs = with_reads(self.tokenizer, self.reads, items, seqs, is_pairs, self.max_length, self.truncation)
        return seqs, is_pairs

    def read_counts(self, inputs: Inputs | Text | Pair) -> list[int]:
        """How many positions each sequence's reward is read at (1 for a one-token read-out); no forward,
        and no DPO reference term computed."""
        return [len(s.reads) if s.reads is not None else 1 for s in self._read_positions(inputs)[0]]

    def read_point(self, batch: Batch, module: nn.Module, where: str) -> Point:
        """Capture `module`'s input ('in') or output ('out') where the reward is read: the read token of
        each row ([n, width]) or, for a multi-position read-out, every read ([m, width], one per read row)."""
        if batch.reads is None:
            return Point(module, where, batch.read_index)
        return Point(module, where, batch.reads.cols, batch.reads.rows)

    def fold(self, batch: Batch, scores: Tensor) -> Tensor | None:
        """Multi-position read-outs: the fold [n, m] of read rows into sequences (α of each read, given
        the per-read scores [m]); None for one read per row."""
        if batch.reads is None:
            return None
        return batch.reads.weights(batch.input_ids.shape[0], scores, self.reads.combine)

    def head_rows(self, h: Tensor, batch: Batch | None = None) -> tuple[Tensor, Tensor]:
        """`head.rows` at read rows `h` [m, d]: rows [m, k, d], bias [m, k], with each read's target
        token and offset (multi-position read-outs) from `batch`."""
        reads = None if batch is None else batch.reads
        rows, bias = self.head.rows(h, None if reads is None else reads.targets)
        return rows, bias if reads is None or reads.offsets is None else bias + reads.offsets[:, None]

    def head_values(self, h: Tensor, batch: Batch | None = None) -> Tensor:
        """The head's objective values [m, k] at read rows `h` [m, d] (targets and offsets from `batch`)."""
        reads = None if batch is None else batch.reads
        values = self.head(h, None if reads is None else reads.targets)
        return values if reads is None or reads.offsets is None else values + reads.offsets[:, None]

    def fits(self, inputs: Inputs | Text | Pair) -> list[bool]:
        """Per sequence of `encode(inputs)`: whether it fits `max_length` (or is cut to it); never raises."""
        items, _ = flatten_inputs(inputs)
        if self.max_length is None or self.truncation == "left":  # nothing is refused: no need to tokenize
            return [True] * len(items)
        return [fits_length(self.tokenize(self.as_read(item)), self.max_length, self.truncation) for item in items]

    def as_read(self, item: Text) -> Text:
        """What the model reads for one input: the input itself, or the question a judge is asked of it."""
        return item if self._kind.question is None else judge_question(item, self._kind.question)

    def tokenize(self, item: Text) -> Tokenized:
        """Token ids of `as_read(item)`, before any length rule (a judge's read after the generation prompt)."""
        make = lambda: tokenize(self.tokenizer, item, encoder=self.encoder, generation=self._kind.name == "judge")
        return self._memo.get(self.tokenizer, item, make)  # each input tokenized once per model

    def batches(
        self, seqs: list[Tokenized], batch_size: int, padding_side: PaddingSide = "right", is_pairs: bool = False,
        index: list[int] | None = None,
    ) -> Iterator[tuple[np.ndarray, Batch]]:
        """Length-sorted batches (less padding); yields original row indices with each batch. On CUDA
        out-of-memory later batches are smaller, and rows that fit in none are reported (model/_oom.py).

        `index`: each sequence's number in the caller's full input (for error messages), when
        `seqs` is a subset of it."""
        if batch_size < 1:
            raise UsageError(f"batch_size must be at least 1, got {batch_size}", option="batch_size")
        lengths = [len(s.ids) for s in seqs]
        yield from batch_loop(np.argsort(lengths, kind="stable"), batch_size,
                              list(range(len(seqs))) if index is None else index, is_pairs,
                              lambda rows, labels: collate([seqs[i] for i in rows], pad_id=self.pad_token_id,
                              side=padding_side, first=self.encoder, device=self.device, labels=labels), lengths)

    def gate_index(self, batch: Batch) -> Tensor:
        """Gated heads: per row, the position whose hidden state the gate reads (ArmoRM's pattern rule)."""
        return gate_positions(list(hf_config(self.model).gating_token_pattern), batch).to(self.device)

    def forward_kwargs(self, **candidates: object) -> dict[str, Any]:
        """The candidates the backbone's forward takes, without the ones that are None."""
        always = ("input_ids", "attention_mask")
        return {k: v for k, v in candidates.items() if v is not None and (k in always or k in self._forward_args)}

    def batch_kwargs(self, batch: Batch) -> dict[str, Any]:
        """Keyword arguments of one backbone forward on `batch` (real position ids, no cache)."""
        return self.forward_kwargs(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                   position_ids=batch.position_ids, token_type_ids=batch.token_type_ids,
                                   use_cache=False)

    def run(self, batch: Batch, points: Mapping[PointKey, Point]) -> dict[PointKey, Tensor]:
        """One no-grad forward of the backbone on `batch`: the captured points in fp32, by their keys (split
        into pieces of rows on CUDA out-of-memory: model/_oom.py)."""
        return run_rows(self, batch, points)

    def read(
        self, seqs: list[Tokenized], *, layers: Sequence[str] = (), batch_size: int = 16, gate: bool = True,
        readout: bool = False,
    ) -> Reading:
        """The read loop (model/_reading.py): one batched no-grad forward per batch, capturing only the read position.

        `seqs` as `encode` returns them (pairs interleaved chosen, rejected); `layers` the depths whose
        residual to keep (`"embed"` or a layer index as a string, negative from the end); `gate=False`
        skips a gated head's gate (whose coefficients, and so `reward` and `readout`, are then NaN: the
        gate was not read). See `Reading` for what comes back.
        """
        sink = Sink(self, len(seqs), layers=layers, gate=gate, readout=readout)
        read_loop(self, seqs, sink, batch_size=batch_size)
        return sink.reading()

    # ---- the reward ---------------------------------------------------------------------------
    @property
    def gated(self) -> bool:
        """Whether the readout coefficients come from a gate read at its own position (ArmoRM's), so they
        move when the residual there moves; False where they are fixed (one output, or a given readout)."""
        return self.arch.head_kind == "gated" and self.head.readout is None

    def final_point(self, cols: Tensor) -> Point:
        """The residual the head reads (the final norm's input, or the last layer's output) at `cols` [n]."""
        if self.arch.final_norm is None:
            return Point(self.layers[-1], "out", cols)
        return Point(get_module(self.model, self.arch.final_norm), "in", cols)

    def final_points(self, batch: Batch, *, gate: bool = True) -> dict[TraceKey, Point]:
        """Capture points the head needs: `final` (the final norm's input, or the last layer's output) and `gate`."""
        where = self.final_point(batch.read_at)
        points = {TraceKey.final(): self.read_point(batch, where.module, where.where)}
        if self.gated and gate:
            if self.arch.final_norm is None:
                raise ArchitectureError(f"map {self.arch.name!r}: a gated head reads its gate through final_norm")
            points[TraceKey.gate()] = Point(get_module(self.model, self.arch.final_norm), "in", self.gate_index(batch))
        return points

    def final_hidden(self, x: Tensor) -> Tensor:
        """The head's input [n, d] from the captured final residual `x` [n, d], in fp32."""
        return x if self.arch.final_norm is None else self.norm(self.arch.final_norm)(x)

    def coefficients(self, captured: Mapping[TraceKey, Tensor]) -> Tensor:
        """Readout coefficients [n, k] for captured final points (the frozen gate, for ArmoRM)."""
        gate_h = self.final_hidden(captured[TraceKey.gate()]) if TraceKey.gate() in captured else None
        return self.head.coefficients(captured[TraceKey.final()].shape[0], gate_h)

    def head_readout(self, captured: Mapping[TraceKey, Tensor], batch: Batch | None = None) -> tuple[Tensor, Tensor]:
        """(objective values [n, k], readout coefficients [n, k]) from captured final points; one row
        per read row, with each read's target and offset from `batch` (multi-position read-outs)."""
        if batch is None and self.reads.multi:
            raise one_read_only()
        return self.head_values(self.final_hidden(captured[TraceKey.final()]), batch), self.coefficients(captured)

    def objectives(self, inputs: Inputs, *, batch_size: int = 16, padding_side: PaddingSide = "right") -> np.ndarray:
        """Per-objective head outputs [n_sequences, k] in fp32 (pairs interleaved chosen, rejected)."""
        return self._score(inputs, batch_size, padding_side)[0]

    def score(self, inputs: Inputs, *, batch_size: int = 16, padding_side: PaddingSide = "right") -> np.ndarray:
        """The scalar reward [n_sequences] (pairs interleaved chosen, rejected), fp32 head and readout."""
        return self._score(inputs, batch_size, padding_side)[1]

    def _score(self, inputs: Inputs, batch_size: int, padding_side: PaddingSide) -> tuple[np.ndarray, np.ndarray]:
        seqs, is_pairs = self.encode(inputs)
        objectives = np.zeros((len(seqs), self.head.n_objectives), dtype=np.float32)
        scalar = np.zeros(len(seqs), dtype=np.float32)
        for rows, batch in self.batches(seqs, batch_size, padding_side, is_pairs):
            values, coef = self.head_readout(self.run(batch, self.final_points(batch)), batch)
            fold = self.fold(batch, (values * coef).sum(-1))
            if fold is not None:  # multi-position read-outs: reads → sequences (coefficients are fixed)
                values, coef = fold @ values, coef[:1].expand(len(rows), -1)
            objectives[rows] = values.cpu().numpy()
            scalar[rows] = (values * coef).sum(-1).cpu().numpy()
        return objectives, scalar

    def _repr_html_(self) -> str:
        from ._view import model_html  # what a notebook shows: architecture, kind, dtype, device, read rule

        return model_html(self)

    def __repr__(self) -> str:
        return (f"RewardModel({type(self.model).__name__}, arch={self.arch.name!r}, layers={self.n_layers}, "
                f"objectives={self.head.n_objectives}, dtype={next(self.model.parameters()).dtype})")

