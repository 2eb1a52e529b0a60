"""The token checks of preference pairs (`rewardlens.data.check_tokens`), run where every instrument
encodes pairs (`RewardModel.encode`), once per set of pairs and before any forward reads them.

The checks themselves are the data layer's, on plain token ids; this module gives them what only the
model layer has: each response tokenized alone, and each sequence's read position by `collate`'s rule.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from ..data import Pair, check_tokens
from ._tokens import Tokenized, collate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..data import Inputs
    from ..types import Text
    from ._reads import Reads

KEPT = 200_000
"""How many checked sequences a model remembers (least recently checked out first)."""


class Encoding(Protocol):
    """What the checks read of a `RewardModel` (which sits above this module: a protocol, no import)."""

    tokenizer: PreTrainedTokenizerBase
    pad_token_id: int | None
    encoder: bool
    """Whether it reads its first token (an encoder sees every token from there)."""
    reads: Reads
    """Its read rule: a set of reads lies inside the response by construction."""


class CheckedPairs:
    """The sequences one model has checked: a call whose every sequence was in a call that passed (an
    audit's chunks, after its whole set) is not checked again, so its verdict is the whole set's; a
    check that raised is not remembered, so the next call is refused too."""

    def __init__(self) -> None:
        self._seen: OrderedDict[int, None] = OrderedDict()

    def check(self, model: Encoding, inputs: Inputs | Text | Pair | None, seqs: list[Tokenized]) -> None:
        """`check_pair_tokens` of the pairs `inputs` (None: not pairs, nothing to check) as `model` reads
        them, unless done already; a decoder's one read token is checked too."""
        if inputs is None:  # texts, probe items, concept sets: no pairs, nothing to hash either
            return
        keys = [hash(tuple(s.ids)) for s in seqs]
        if all(key in self._seen for key in keys):
            return
        check_pair_tokens(model.tokenizer, inputs, seqs, pad_id=model.pad_token_id,
                          reads=not (model.encoder or model.reads.multi))
        for key in keys:
            self._seen[key] = None
            self._seen.move_to_end(key)
        while len(self._seen) > KEPT:
            self._seen.popitem(last=False)


def check_pair_tokens(tokenizer: PreTrainedTokenizerBase, inputs: Inputs | Text | Pair, seqs: Sequence[Tokenized],
                      *, pad_id: int | None, reads: bool) -> None:
    """The token checks of the pairs `inputs` on `seqs`, the ids a model reads of them [2n]: raises
    `TokenizationError` when no pair's responses reach the model, else warns of the pairs found.

    Each response is tokenized alone, stripped (its edges may merge with the template's tokens);
    `reads`: whether a decoder's one read token is checked too, found by `collate`'s rule (a
    right-padded batch leaves every position where it is), 256 sequences at a time."""
    pairs = [inputs] if isinstance(inputs, Pair) else [p for p in inputs if isinstance(p, Pair)]
    texts = [text.strip() for pair in pairs for text in (pair.chosen, pair.rejected)]
    responses = [list(r) for r in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    at = None
    if reads:
        cpu = torch.device("cpu")
        at = [int(r) for i in range(0, len(seqs), 256)
              for r in collate(list(seqs[i:i + 256]), pad_id=pad_id, side="right", first=False, device=cpu)
              .read_at.tolist()]
    check_tokens(pairs, [s.ids for s in seqs], responses, at).report(stacklevel=4)
