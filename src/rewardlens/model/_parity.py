"""Score parity: rewardlens' `RewardModel.score` against the model's own Hugging Face forward.

Five checks, one per bug the field reports most (docs/scoring.md, *Score parity*). Every check is a
largest |difference| over the sequences of the pairs (chosen, rejected interleaved):

- `batch_size`  (reward-bench #137): score at batch size 1 against batch size 8 (right padding);
- `padding_side` (reward-bench #154): left against right padding, batch size 8;
- `double_bos`  (reward-bench #164): score at batch size 1 against the model's own forward on the
  chat template's own rendering (`apply_chat_template(tokenize=False)` tokenized without special
  tokens; plain text as the tokenizer encodes it, a doubled leading BOS kept once);
- `pad_eos`     (RLHFlow #49): score in a right-padded batch of 8 against the model's own forward on
  each sequence alone, unpadded, where nothing can mistake an eos inside the text for padding;
- `trl_read`    (trl #6952): score against the model's own logits on a right-padded batch of 8 built as
  TRL's RewardTrainer builds one (pad id, attention mask, no position ids): the convention RMs are
  trained with, the last non-pad token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import HeadError
from ..plotting import HtmlView
from ..stats import summary_frame
from ._arch import text_config
from ._core import RewardModel
from ._finite import dtype_name
from ._hooks import eval_mode
from ._tokens import Tokenized, flatten_inputs

if TYPE_CHECKING:
    import pandas as pd

    from ..data import Inputs
    from ..types import Text

CHECKS = ("batch_size", "padding_side", "double_bos", "pad_eos", "trl_read")
"""The five checks `parity` runs, in order."""

TOLERANCE: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.float64: 1e-8,
                                       torch.bfloat16: 3e-2, torch.float16: 3e-2}
"""Largest |difference| each check allows, relative to the rewards' scale `max(1, max |reward|)` (so an
absolute bound for rewards within ±1): fp32 reductions reorder between a batch and one sequence at
~1e-6, so 1e-4 leaves room and is still far below any bug (a wrong token moves a reward by O(0.1));
bf16 and fp16 keep 8 and 11 mantissa bits, and padding alone moves a 32-layer bf16 reward by ~1e-2."""

BATCH = 8
"""The batched side of every check: large enough that the pairs' lengths differ within a batch."""


@dataclass(frozen=True)
class ParityCheck:
    """One check: the largest |difference| over `n` sequences against its `tolerance` (scaled)."""

    name: str
    difference: float
    tolerance: float
    n: int

    @property
    def passed(self) -> bool:
        # NaN fails: a non-finite score proves nothing.
        return bool(self.difference <= self.tolerance)


@dataclass(frozen=True)
class Parity(HtmlView):
    """The five checks of `parity` on one model and one set of inputs, for `dtype` (the backbone's)."""

    checks: tuple[ParityCheck, ...]
    dtype: str

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[ParityCheck]:
        return [c for c in self.checks if not c.passed]

    def summary(self) -> pd.DataFrame:
        """One row per check, indexed by its name: `value` (the largest |difference|), `n` (sequences
        compared), `tolerance`, `passed` (`stats.summary_frame`)."""
        return summary_frame([{"name": c.name, "value": c.difference, "n": c.n, "tolerance": c.tolerance,
                               "passed": c.passed} for c in self.checks])

    def line(self) -> str:
        """The checks in one line: every one within tolerance with the largest difference, or each failure."""
        if self.passed:
            worst = max(self.checks, key=lambda c: c.difference / c.tolerance)
            return (f"all {len(self.checks)} checks within tolerance ({self.dtype}); largest |difference| "
                    f"{worst.difference:.1e} ({worst.name}) against a tolerance of {worst.tolerance:.1e}")
        return "FAILED: " + "; ".join(f"{c.name} {c.difference:.3e} > {c.tolerance:.1e}" for c in self.failed) + (
            f" ({self.dtype}); run `rewardlens parity MODEL --pairs FILE` for every check")

    def to_frame(self) -> pd.DataFrame:
        """One row per check: name, difference (largest |difference|), tolerance, passed, n."""
        import pandas as pd

        return pd.DataFrame([{"name": c.name, "difference": c.difference, "tolerance": c.tolerance,
                              "passed": c.passed, "n": c.n} for c in self.checks])

    def __getitem__(self, name: str) -> ParityCheck:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no parity check named {name!r}; the checks are {', '.join(CHECKS)}")


def _own_scalar(model: RewardModel, out: Any) -> torch.Tensor:
    """The model's own scalar reward [n] from its output: a gated head's own `score`, else its logits
    [n, k] through the fixed readout."""
    score = getattr(out, "score", None)
    if score is not None:
        return score.float().reshape(-1)
    logits = out.logits.float()
    return (logits * model.head.coefficients(logits.shape[0]).to(logits.device)).sum(-1)


def _own_forward(model: RewardModel, kwargs: dict[str, torch.Tensor]) -> np.ndarray:
    with torch.no_grad(), eval_mode(model.model):  # a model wrapped mid-training must not drop out here
        out = model.model(**{k: v.to(model.device) for k, v in kwargs.items()})
    return _own_scalar(model, out).cpu().numpy()


def own_unpadded(model: RewardModel, seqs: list[Tokenized]) -> np.ndarray:
    """The yardstick: the model's own reward [n] on each sequence alone, unpadded (no mask, no
    position ids, no hooks), so no padding or batching rule of anyone's can enter."""
    out = []
    for s in seqs:
        kwargs = {"input_ids": torch.tensor([s.ids])}
        if s.type_ids is not None:
            kwargs["token_type_ids"] = torch.tensor([s.type_ids])
        out.append(_own_forward(model, kwargs)[0])
    return np.array(out, dtype=np.float64)


def own_trl_batches(model: RewardModel, seqs: list[Tokenized], batch_size: int = BATCH) -> np.ndarray:
    """The model's own logits [n] on right-padded batches in input order, as TRL's RewardTrainer feeds a
    model: `model(input_ids, attention_mask)`, the config's pad id after each sequence, no position ids.
    A decoder whose config has no pad id refuses batches of more than one, so it is fed one at a time."""
    pad = getattr(text_config(model.model), "pad_token_id", None)
    if pad is None and not model.encoder:
        batch_size = 1
    pad = 0 if pad is None else pad
    out: list[float] = []
    for start in range(0, len(seqs), batch_size):
        chunk = seqs[start:start + batch_size]
        width = max(len(s.ids) for s in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        types = torch.zeros_like(ids) if chunk[0].type_ids is not None else None
        for row, s in enumerate(chunk):
            ids[row, :len(s.ids)], mask[row, :len(s.ids)] = torch.tensor(s.ids), 1
            if types is not None and s.type_ids is not None:
                types[row, :len(s.ids)] = torch.tensor(s.type_ids)
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if types is not None:
            kwargs["token_type_ids"] = types
        out.extend(_own_forward(model, kwargs).tolist())
    return np.array(out, dtype=np.float64)


def template_ids(model: RewardModel, item: Text, ours: Tokenized) -> list[int]:
    """The token ids the model's own template gives `item`: a conversation rendered to text by the chat
    template and tokenized without special tokens (the template places BOS itself); otherwise our ids
    with a doubled leading BOS kept once (the tokenizer's BOS on text that already had one)."""
    tok = model.tokenizer
    if not isinstance(item, str) and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(item, tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])
    bos = tok.bos_token_id
    ids = list(ours.ids)
    while bos is not None and ids[:2] == [bos, bos]:
        ids = ids[1:]
    return ids


def _rendered(ids: list[int], ours: Tokenized) -> Tokenized:
    # Token types belong to our ids; the template's rendering of a conversation has none.
    return Tokenized(ids, ours.type_ids if ids == ours.ids else None)


def _check(name: str, ours: np.ndarray, theirs: np.ndarray, tol: float) -> ParityCheck:
    scale = max(1.0, float(np.abs(theirs).max()) if theirs.size else 1.0)
    gap = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    return ParityCheck(name, float(np.nan if np.isnan(gap).any() else gap.max()), tol * scale, len(gap))


def _refuse_kind(model: RewardModel) -> None:
    if model.reads.multi or model.kind.name != "classifier":
        raise HeadError(f"parity compares a sequence classifier's one read token with its own logits; this model "
                        f"is a {model.kind.name!r} (read at {model.reads.at!r}); load it with rewardlens.load as a "
                        "sequence classifier, or check its scores with verify")


def tolerance(model: RewardModel) -> float:
    """`TOLERANCE` for the backbone's dtype (the half-precision value for a dtype it does not name)."""
    return TOLERANCE.get(next(model.model.parameters()).dtype, TOLERANCE[torch.bfloat16])


def parity(model: RewardModel, inputs: Inputs) -> Parity:
    """Run the five checks of this module's docstring on `inputs` (pairs or texts); see `Parity`.

    Costs three rewardlens scorings and n + n/8 of the model's own forwards for n sequences, plus one for
    each sequence the chat template renders to other ids than rewardlens reads (`double_bos`'s yardstick)."""
    _refuse_kind(model)
    tol = tolerance(model)
    seqs, _ = model.encode(inputs)
    items, _ = flatten_inputs(inputs)
    one = model.score(inputs, batch_size=1).astype(np.float64)
    right = model.score(inputs, batch_size=BATCH, padding_side="right").astype(np.float64)
    left = model.score(inputs, batch_size=BATCH, padding_side="left").astype(np.float64)
    template = [_rendered(template_ids(model, item, s), s) for item, s in zip(items, seqs)]
    own = own_unpadded(model, seqs)
    # The template's own rendering is, as a rule, the ids rewardlens reads: its unpadded forward is the
    # same forward, so only the sequences rendered otherwise run again.
    other = [i for i, (t, s) in enumerate(zip(template, seqs)) if (t.ids, t.type_ids) != (s.ids, s.type_ids)]
    rendered = own.copy()
    if other:
        rendered[other] = own_unpadded(model, [template[i] for i in other])
    checks = (
        _check("batch_size", right, one, tol),
        _check("padding_side", left, right, tol),
        _check("double_bos", one, rendered, tol),
        _check("pad_eos", right, own, tol),
        _check("trl_read", right, own_trl_batches(model, seqs), tol),
    )
    return Parity(checks, dtype_name(model) or "unknown")
