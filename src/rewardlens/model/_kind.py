"""`RewardKind`: which of the four kinds of reward model a `RewardModel` is, with what defines it.

A sequence classifier reads one head at one token; a process RM reads its head at every step
separator; an LLM judge is asked a question of each input and reads two answer rows; a DPO reward reads
`β log π` at every response token, against a reference (docs/design.md §1 "Reward kinds"). The
loaders (`load`, `load_prm`, `load_judge`, `load_dpo` and their `wrap_*` twins) build the kind, and
`RewardModel` holds it frozen: which combinations are valid is checked here, once, not left to
attributes set from outside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, get_args

from ..errors import HeadError, UsageError

if TYPE_CHECKING:
    from ._readout import Head
    from ._reads import ReadAt, Reads
    from ._tokens import Tokenized

Reference = TypeVar("Reference")
"""A DPO reference's type: `RewardModel` (`RewardModel.kind` is a `RewardKind[RewardModel]`), a type variable
only because model/_core imports this module, and no import may go back."""
KindName = Literal["classifier", "prm", "judge", "dpo"]
"""The four kinds: a sequence classifier, a process RM, an LLM judge, an implicit DPO reward."""
KIND_NAMES: tuple[KindName, ...] = get_args(KindName)
ReferenceTerm = Literal["constant", "separate"]
"""How a DPO reference enters: a constant per read (its log-probabilities on this input), or not at all
(the reward is `β log π` alone, and `model.reference` decomposes `β log π_ref` over its own parts)."""
REFERENCE_TERMS: tuple[ReferenceTerm, ...] = get_args(ReferenceTerm)
Offsets = Callable[[list["Tokenized"]], list[tuple[float, ...]]]
"""A constant per read of each sequence, from the sequences (a DPO reference's term `−β log π_ref`)."""

READ_AT_OF: dict[KindName, ReadAt] = {"classifier": "last", "prm": "separator", "judge": "last", "dpo": "response"}
"""Where each kind reads its reward (`Reads.at`)."""
_READ_THERE: dict[ReadAt, str] = {
    "last": "one token is a classifier (rl.wrap) or a judge (rl.model.wrap_judge)",
    "separator": "every step separator is a PRM (RewardKind('prm'), rl.model.wrap_prm)",
    "response": "every response token is a DPO reward (RewardKind('dpo', beta=...), rl.model.wrap_dpo)",
}


@dataclass(frozen=True)
class RewardKind(Generic[Reference]):
    """Which kind of reward model, and what defines it beyond its head and read rule (frozen).

    `RewardKind()` is a sequence classifier; `RewardKind("judge", question=...)` an LLM judge;
    `RewardKind("prm")` a process RM; `RewardKind("dpo", beta=..., reference=..., reference_term=...,
    offsets=...)` a DPO reward (with `reference=None` and no term: `β log π` alone, as a DPO reward's
    own `model.reference` is read).
    """

    name: KindName = "classifier"
    """'classifier', 'prm', 'judge' or 'dpo'."""
    question: str | None = None
    """A judge's question, with {response} (and maybe {prompt}): each input is asked it; judges only."""
    beta: float | None = None
    """DPO's KL weight β (the head's `scale`); DPO only, and required there."""
    reference: Reference | None = None
    """A DPO reward's reference, read the same way (β log π_ref); DPO only."""
    reference_term: ReferenceTerm | None = None
    """How the reference enters ('constant' or 'separate'); given exactly when `reference` is."""
    offsets: Offsets | None = field(default=None, repr=False)
    """The reference's constant term per read, from the sequences; exactly when `reference_term='constant'`."""

    def __post_init__(self) -> None:
        if self.name not in KIND_NAMES:
            raise UsageError(f"RewardKind.name must be one of {KIND_NAMES}, got {self.name!r}")
        if (self.name == "judge") != (self.question is not None):
            raise UsageError(f"RewardKind({self.name!r}, question={self.question!r}): a question is given exactly "
                             "for a judge; pass question= with name='judge' (rl.model.wrap_judge), and only there")
        if self.question is not None and "{response}" not in self.question:
            raise UsageError(f"the judge's question must contain {{response}} (and may contain {{prompt}}), got "
                             f"{self.question!r}")
        if self.name != "dpo":
            given = [f for f in ("beta", "reference", "reference_term", "offsets") if getattr(self, f) is not None]
            if given:
                raise UsageError(f"RewardKind({self.name!r}) was given {given[0]}=, which only a DPO reward has; "
                                 "drop it, or pass name='dpo' (rl.model.wrap_dpo)")
            return
        self._check_dpo()

    def _check_dpo(self) -> None:
        if self.beta is None or not self.beta > 0:
            raise UsageError(f"beta must be positive (DPO's KL weight), got {self.beta}")
        if self.reference_term is not None and self.reference_term not in REFERENCE_TERMS:
            raise UsageError(f"reference_term must be 'constant' or 'separate', got {self.reference_term!r}")
        if (self.reference is None) != (self.reference_term is None):
            raise UsageError(f"RewardKind('dpo', reference={self.reference!r}, reference_term="
                             f"{self.reference_term!r}): a reference and its term come together; pass both (or "
                             "neither, for `β log π` alone)")
        if (self.reference_term == "constant") != (self.offsets is not None):
            raise UsageError(f"RewardKind('dpo', reference_term={self.reference_term!r}): the offsets (the "
                             "reference's constant per read) are given exactly when reference_term='constant'")

    def check_model(self, reads: Reads, head: Head) -> None:
        """Refuse a read rule or head this kind does not read by (`RewardModel.__init__`)."""
        at = READ_AT_OF[self.name]
        if reads.at != at:
            raise HeadError(f"RewardKind({self.name!r}) reads at {at!r}, not Reads(at={reads.at!r}): a reward read "
                            f"at {_READ_THERE[reads.at]}; pass that kind, or Reads(at={at!r})")
        if self.name == "dpo" and not head.log_prob:
            raise HeadError("a DPO reward reads a log-probability head (Head.from_lm_head(scale=β)); build it with "
                            "rl.model.wrap_dpo")
        if self.name != "dpo" and head.log_prob:
            raise HeadError(f"a {self.name} reward does not read a log-probability head; that is a DPO reward "
                            "(RewardKind('dpo', beta=...), rl.model.wrap_dpo)")
        if self.name == "dpo" and head.scale != self.beta:
            raise HeadError(f"the DPO kind's beta={self.beta} is not its head's scale {head.scale}; build both "
                            "from one β (rl.model.wrap_dpo)")
        if self.name == "judge" and head.tokens is None:
            raise HeadError("a judge reads two rows of its LM head (Head.from_lm_head(tokens=...)); build it with "
                            "rl.model.wrap_judge")
        if self.name == "classifier" and head.tokens is not None:
            raise HeadError(f"a classifier reads its own head, not LM rows {head.tokens}; an LM read as two tokens "
                            "is a judge (rl.model.wrap_judge) or a PRM (rl.model.wrap_prm(tokens=...))")


CLASSIFIER: RewardKind[Any] = RewardKind()
"""The kind of a sequence-classification reward model (`rl.load`, `rl.wrap`): nothing beyond its head."""
