"""Inputs to token ids and padded batches, with the read position made explicit.

Rules (docs/scoring.md explains them for users):
- a chat conversation is tokenized once with `apply_chat_template(tokenize=True)`; templating to
  text and re-tokenizing would duplicate BOS on Llama-3;
- without a chat template, a decoder reads `prompt + "\\n\\n" + response` (the join counts as the
  prompt's when a read rule asks where the response starts) and an encoder reads the text pair
  `(prompt, response)` ([CLS] p [SEP] r [SEP]);
- the read position of a decoder is Hugging Face's: the rightmost token whose id is not the pad id
  (the last attended token when there is no pad id); an encoder reads its first token;
- sequences longer than the limit are refused, or cut from the left so the read token survives.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import Tensor

from ..data import Inputs, Pair, pair_of
from ..errors import TokenizationError, UsageError, warn
from ..types import Conversation, PaddingSide, Text, Truncation
from ._reads import Reads, ReadSet, collate_reads, one_read_only, warn_unscored

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

JOIN = "\n\n"
"""What a decoder without a chat template reads between prompt and response (part of the prompt)."""


def _is_conversation(x: object) -> TypeGuard[Conversation]:
    return isinstance(x, list) and bool(x) and all(isinstance(m, Mapping) and "role" in m for m in x)


def flatten_inputs(inputs: Inputs | Text | Pair) -> tuple[list[Text], bool]:
    """Normalise user inputs to a list of texts/conversations; pairs become [chosen, rejected, ...].

    Returns `(items, is_pairs)`. Accepts a string, a conversation, a Pair, or a list of any one kind.
    """
    given: object = [inputs] if isinstance(inputs, (str, Pair)) or _is_conversation(inputs) else inputs
    if not isinstance(given, Sequence) or isinstance(given, str) or len(given) == 0:
        raise TypeError(
            "inputs must be a non-empty list of strings, chat conversations (lists of {'role','content'}) "
            f"or rewardlens.Pair, got {type(given).__name__}"
        )
    pairs = [x for x in given if isinstance(x, Pair)]
    if len(pairs) == len(given):
        items: list[Text] = [conv for p in pairs for conv in (p.conversation("chosen"), p.conversation("rejected"))]
        return items, True
    if pairs:
        raise TypeError("inputs mix rewardlens.Pair with plain texts/conversations; pass one kind per call")
    texts: list[Text] = []
    for i, x in enumerate(given):
        if isinstance(x, str) or _is_conversation(x):
            texts.append(x)
        else:
            raise TypeError(f"input {i} is a {type(x).__name__}; expected a string or a list of chat messages")
    return texts, False


@dataclass(frozen=True)
class Tokenized:
    """One sequence: token ids and, for encoders, token type ids."""

    ids: list[int]
    type_ids: list[int] | None = None
    prompt_length: Callable[[], int] | None = field(default=None, compare=False, repr=False)
    """Counts the tokens before the response (prompt and template), on demand: only a cut needs it."""
    cut: tuple[str, int, int] | None = field(default=None, compare=False, repr=False)
    """Set by `fit_length` when left truncation removed most of the prompt: (label, prompt tokens
    removed, prompt tokens)."""
    reads: tuple[int, ...] | None = None
    """Multi-position read-outs: the positions the reward is read at (model/_reads.py); None: one read token."""
    targets: tuple[int, ...] | None = None
    """The token whose log-probability each read reads (LM log-probability read-outs), else None."""
    offsets: tuple[float, ...] | None = None
    """A constant added to each read's score (a DPO reference's term), else None."""


class TokenMemo:
    """The token ids of the inputs one model has read, by input: `RewardModel.tokenize` asks it first, so
    an input several instruments read (a probe item's length check, then its scoring; the same items for
    the probes and the concepts) is tokenized once per model.

    An entry is keyed by the input's JSON, the tokenizer object, its chat template and its size, so a
    tokenizer swapped, a template changed or tokens added after load are tokenized afresh; `Tokenized`
    is frozen, so a shared entry cannot be changed by a reader. Bounded by tokens held (least recently
    used out first)."""

    def __init__(self, max_tokens: int = 2_000_000) -> None:
        self.max_tokens = max_tokens
        self._held: OrderedDict[tuple[str, int, str | None, int], Tokenized] = OrderedDict()
        self._tokens = 0

    def get(self, tokenizer: Any, item: Text, make: Callable[[], Tokenized]) -> Tokenized:
        """The memoised `make()` for `item` read by `tokenizer`."""
        key = (json.dumps(item, sort_keys=True, ensure_ascii=False), id(tokenizer),
               getattr(tokenizer, "chat_template", None), len(tokenizer) if hasattr(tokenizer, "__len__") else 0)
        got = self._held.get(key)
        if got is not None:
            self._held.move_to_end(key)
            return got
        got = make()
        self._held[key] = got
        self._tokens += len(got.ids)
        while self._tokens > self.max_tokens and len(self._held) > 1:
            _, old = self._held.popitem(last=False)
            self._tokens -= len(old.ids)
        return got


def _as_ids(out: Any) -> list[int]:
    """Token ids from what `apply_chat_template` returns: ids, a batch of one, a tensor or an encoding."""
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):
        out = out[0]
    return list(out)


def _split_response(conv: Conversation) -> tuple[str, str | None]:
    if conv[-1]["role"] == "assistant":
        return "\n".join(m["content"] for m in conv[:-1]), conv[-1]["content"]
    return "\n".join(m["content"] for m in conv), None


def judge_question(item: Text, template: str) -> Conversation:
    """An LLM judge's input: one user turn asking `template` (with `{prompt}` and `{response}` filled in
    from the conversation's last assistant turn and what precedes it; a plain text is the response)."""
    if isinstance(item, str):
        prompt, response = "", item
    else:
        prompt, answer = _split_response(item)
        response = answer or ""
    return [{"role": "user", "content": template.format(prompt=prompt, response=response)}]


def tokenize(tokenizer: PreTrainedTokenizerBase, item: Text, *, encoder: bool, generation: bool = False) -> Tokenized:
    """Token ids of one text or conversation under the rules in this module's docstring; `generation`
    ends a conversation with the template's opening of the assistant's turn (a judge reads there)."""
    length: Callable[[], int] | None = None
    if isinstance(item, str):
        enc = tokenizer(item, add_special_tokens=True)
    elif generation and getattr(tokenizer, "chat_template", None):
        return Tokenized(_as_ids(tokenizer.apply_chat_template(item, tokenize=True, add_generation_prompt=True)))
    elif getattr(tokenizer, "chat_template", None):
        if len(item) > 1 and item[-1]["role"] == "assistant":
            length = lambda: len(_as_ids(tokenizer.apply_chat_template(item[:-1], tokenize=True,
                                                                         add_generation_prompt=True)))
        return Tokenized(_as_ids(tokenizer.apply_chat_template(item, tokenize=True)), prompt_length=length)
    else:
        prompt, response = _split_response(item)
        if response is None:
            enc = tokenizer(prompt, add_special_tokens=True)
        elif encoder:
            length = lambda: len(tokenizer(prompt, add_special_tokens=True)["input_ids"])
            enc = tokenizer(prompt, response, add_special_tokens=True)
        else:
            enc = tokenizer(prompt + JOIN + response, add_special_tokens=True)
            full = list(enc["input_ids"])
            # The join belongs to the prompt; a token it merges with the response stays the response's.
            length = lambda: _shared_prefix(tokenizer(prompt + JOIN, add_special_tokens=True)["input_ids"], full)
    types = enc.get("token_type_ids") if encoder else None
    return Tokenized(list(enc["input_ids"]), list(types) if types is not None else None, length)


def _shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading token ids `a` and `b` share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def content_span(tokenizer: PreTrainedTokenizerBase, item: Text) -> tuple[int, int] | None:
    """(first token of the assistant's content, tokens the template writes after it) of a conversation
    ending with the assistant's turn, or None without a chat template. Found from the turn rendered
    with empty content, not from the generation prompt: a template may write more before the content
    of a finished turn (Qwen3's empty think block) than it opens a new turn with."""
    if isinstance(item, str) or not getattr(tokenizer, "chat_template", None) or item[-1]["role"] != "assistant":
        return None
    full = _as_ids(tokenizer.apply_chat_template(item, tokenize=True))
    empty = _as_ids(tokenizer.apply_chat_template([*item[:-1], {"role": "assistant", "content": ""}], tokenize=True))
    start = _shared_prefix(empty, full)
    return start, len(empty) - start


def with_reads(
    tokenizer: PreTrainedTokenizerBase, reads: Reads, items: list[Text], seqs: list[Tokenized], is_pairs: bool,
    max_length: int | None, truncation: Truncation = "error",
) -> list[Tokenized]:
    """`seqs` (tokenized `items`, fitted to length) with their read positions and targets for a
    multi-position read-out (model/_reads.py): steps are searched in the assistant's content (an open
    last step closed by its separator, `Reads.closed`), and a DPO reward reads every token the
    assistant's turn adds to its generation prompt."""
    separator = reads.separator_id(tokenizer) if reads.at == "separator" else None
    out, unscored = [], []
    for i, (item, seq) in enumerate(zip(items, seqs)):
        label = sequence_label(i, is_pairs)
        if not isinstance(item, str) and item[-1]["role"] != "assistant":
            raise TokenizationError(f"{label} ends with a {item[-1]['role']!r} turn, so it has no response to read "
                                    "the reward in; end each conversation with the assistant's turn")
        if seq.prompt_length is None and reads.at == "response":
            raise TokenizationError(f"{label} has no prompt/response split, so no response tokens to read; pass "
                                    "Pairs or conversations ending with the assistant's turn")
        span = content_span(tokenizer, item) if separator is not None else None
        prompt, suffix = span or (seq.prompt_length() if seq.prompt_length else 0, 0)
        if prompt and len(seq.ids) == max_length:  # a left cut may have moved the response start
            prompt = max(prompt - (len(tokenize(tokenizer, item, encoder=False).ids) - len(seq.ids)), 0)
        ids, prompt = reads.closed(seq.ids, prompt, separator, suffix, label, (max_length, truncation))
        fitted = fit_length(replace(seq, ids=ids), label, max_length, truncation, False)  # a separator past the limit
        ids, prompt = fitted.ids, max(prompt - (len(ids) - len(fitted.ids)), 0)
        if reads.final == "ignore" and reads.open_end(ids, prompt, separator, suffix):
            unscored.append(label)
        where, targets = reads.positions(ids, prompt, separator, label, suffix)
        out.append(replace(fitted, reads=where, targets=targets))
    warn_unscored(unscored, len(seqs))
    return out


def fits_length(tok: Tokenized, max_length: int | None, truncation: Truncation) -> bool:
    """Whether `fit_length` takes `tok` (as it is, or cut from the left) rather than refusing it: the one rule."""
    return max_length is None or len(tok.ids) <= max_length or truncation == "left"


def fit_length(
    tok: Tokenized, label: str, max_length: int | None, truncation: Truncation, first: bool
) -> Tokenized:
    """Refuse or left-truncate a sequence over `max_length`, never dropping the read token.

    A cut that removes more than half of the prompt's tokens (the prompt and the template around it,
    before the response) is recorded in `cut`, for `warn_encoded` to report: the reward of a
    response whose question is gone answers a different question."""
    if not fits_length(tok, max_length, truncation):
        raise TokenizationError(
            f"{label} has {len(tok.ids)} tokens, over the limit of {max_length}; cutting it from "
            "the right would drop the read token. Raise max_length=, shorten the input, or pass "
            "truncation='left' to drop tokens from the start (the response end and read token stay).",
            option="max_length"
        )
    if max_length is None or len(tok.ids) <= max_length:
        return tok
    keep = max_length - 1 if first else max_length

    def cut(xs: list[int]) -> list[int]:
        return (xs[:1] if first else []) + xs[len(xs) - keep:]

    removed, prompt = len(tok.ids) - keep - first, (tok.prompt_length() - first) if tok.prompt_length else 0
    lost = (label, min(removed, prompt), prompt) if prompt > 0 and 2 * removed > prompt else None
    return Tokenized(cut(tok.ids), None if tok.type_ids is None else cut(tok.type_ids), tok.prompt_length, lost)


@dataclass(frozen=True)
class Batch:
    """Padded tensors for one forward pass, plus the read position of every row."""

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    token_type_ids: Tensor | None
    read_at: Tensor
    """Hugging Face's read position of every row [n] (what `read_index` gives for one read per row)."""
    labels: list[str] | None = None
    """What each row is, for error messages ("input 3", "pair 1 (rejected)")."""
    reads: ReadSet | None = None
    """Multi-position read-outs: every read of every row (model/_reads.py); None: one read per row."""

    @property
    def read_index(self) -> Tensor:
        """The read position of every row [n]; refused for a multi-position read-out, whose reward is
        read at a set of positions (`reads`), so an instrument that assumes one read token stops here."""
        if self.reads is not None:
            raise one_read_only()
        return self.read_at


def sequence_label(index: int, is_pairs: bool) -> str:
    return "pair {} ({})".format(*pair_of(index)) if is_pairs else f"input {index}"


def collate(
    seqs: list[Tokenized], *, pad_id: int | None, side: PaddingSide, first: bool, device: torch.device,
    labels: list[str] | None = None,
) -> Batch:
    """Pad `seqs` on `side` with `pad_id` (0 under the mask when there is none) and find read positions."""
    if side not in ("left", "right"):
        raise UsageError(f"padding side must be 'left' or 'right', got {side!r}")
    width = max(len(s.ids) for s in seqs)
    fill = 0 if pad_id is None else pad_id
    ids = torch.full((len(seqs), width), fill, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    types = torch.zeros((len(seqs), width), dtype=torch.long) if any(s.type_ids for s in seqs) else None
    for row, s in enumerate(seqs):
        span = slice(width - len(s.ids), width) if side == "left" else slice(0, len(s.ids))
        ids[row, span] = torch.tensor(s.ids)
        mask[row, span] = 1
        if types is not None and s.type_ids:
            types[row, span] = torch.tensor(s.type_ids)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cols = torch.arange(width)
    if first:
        read = mask.argmax(-1)  # first attended position
    elif pad_id is None:
        read = (cols * mask).amax(-1)
    else:  # Hugging Face's rule: the rightmost token whose id is not pad ...
        real = (ids != pad_id) & mask.bool()
        # ... and, for a sequence made only of pad ids, its first token, as on the unpadded input.
        read = torch.where(real.any(-1), (cols * real.long()).amax(-1), mask.argmax(-1))
    reads = None
    if seqs[0].reads is not None:
        shifts = [width - len(s.ids) if side == "left" else 0 for s in seqs]
        reads = collate_reads([(s.reads or (), s.targets, s.offsets) for s in seqs], shifts, device)
    return Batch(ids.to(device), mask.to(device), positions.to(device), None if types is None else types.to(device),
                 read.to(device), labels, reads)


def warn_pad_is_eos(tokenizer: PreTrainedTokenizerBase, seqs: list[Tokenized], pad_id: int | None) -> None:
    """Say so when a sequence ends in the pad id: the model's own pooling reads an earlier token."""
    if pad_id is None:
        return
    ends = [i for i, s in enumerate(seqs) if s.ids and s.ids[-1] == pad_id]
    if ends:
        name = tokenizer.convert_ids_to_tokens(pad_id)
        same = " (pad = eos)" if pad_id == tokenizer.eos_token_id else ""
        warn(
            f"{len(ends)} sequence(s) (first: {ends[0]}) end in token {pad_id} ({name!r}), which is also the pad "
            f"token{same}: like the model's own forward, rewardlens reads the last token that is not "
            "pad, one or more tokens early. To read the true last token pass pad_token_id=<another id> "
            "to rewardlens.load (scores then differ from the model's own logits by design)."
        )


def warn_encoded(tokenizer: PreTrainedTokenizerBase, seqs: list[Tokenized]) -> None:
    """The warnings about a call's encoded sequences as a whole: doubled BOS, prompts cut away."""
    warn_double_bos(tokenizer, seqs)
    cut = [s.cut for s in seqs if s.cut is not None]
    if cut:
        shown = "; ".join(f"{label}: {lost} of {n} prompt tokens" for label, lost, n in cut[:10])
        more = f"; and {len(cut) - 10} more" if len(cut) > 10 else ""
        warn(
            f"left truncation removed more than half of the prompt of {len(cut)} sequence(s) ({shown}{more}): "
            "their reward no longer sees most of what was asked, and can change sign. Raise max_length= or "
            "--max-length if the model allows, or shorten the prompts."
        )


def warn_double_bos(tokenizer: PreTrainedTokenizerBase, seqs: list[Tokenized]) -> None:
    """Say so when a text already carried BOS and the tokenizer added another (pre-templated text)."""
    bos = tokenizer.bos_token_id
    doubled = [i for i, s in enumerate(seqs) if bos is not None and s.ids[:2] == [bos, bos]]
    if doubled:
        warn(
            f"{len(doubled)} sequence(s) (first: {doubled[0]}) start with BOS twice: the text was already "
            "templated and the tokenizer added its own BOS. Pass the conversation (a list of messages) "
            "instead, or strip the leading BOS from the text."
        )
