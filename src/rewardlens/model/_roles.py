"""Which tokens of a sequence are the prompt's text, the response's text, or the template's (docs/tokens.md).

The rule, one for every chat template and for none: a token is the response's (a prompt message's)
when its characters overlap the characters of the conversation's last assistant content (of any
earlier message's content) in the text the model reads; every other token is the template's: role
headers, special ids (BOS, EOS, [CLS]/[SEP], a template's `<|im_end|>`), a default system prompt,
and the separators a template or the plain join (`prompt + "\\n\\n" + response`) adds. A token that
straddles the template's text and a content's is the content's: it carries that content's text.
The read token follows the same rule: the template's where a template ends the sequence (ChatML's
final newline, an EOS), the response's last word where a plain concatenation ends on it. A plain
string input is all response (what is scored), apart from the special tokens around it.

Where each content lies in the text is found exactly, whatever the template writes around it: the
conversation is rendered again with every content replaced by a sentinel, and the sentinels spliced
back to the real contents must give the text the model reads. A template that rewrites a content
(trims it, splits a think block off) fails that check, and each message is then found alone: rendered
with only its content replaced by a sentinel, the text before and after the sentinel is the template's
around it. A judge's question is located the same way with sentinels in its `{prompt}` and `{response}`.
Token offsets are the tokenizer's offset mapping over that text, and the ids it gives must be the ids
the model reads (a left cut keeps a suffix, and an encoder's first token); where they cannot be had
(a slow tokenizer, a template that renders a sentinel twice), special ids are the template's and
every other token the response's, with a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from ..errors import warn
from ._tokens import JOIN

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..types import Conversation, Text

TEMPLATE: Final = 0
PROMPT: Final = 1
RESPONSE: Final = 2
ROLES: tuple[str, str, str] = ("template", "prompt", "response")
"""A token's role by its code: `ROLES[code]`."""

Span = tuple[int, int, int, int]
"""(sequence of a text pair, first character, end character, role) of one content."""


def _mark(k: int) -> str:
    """A sentinel no template writes and no tokenizer needs to split sensibly: private-use characters."""
    return f"\ue000rl{k}\ue001"


def _render(tokenizer: PreTrainedTokenizerBase, conv: Conversation, generation: bool) -> str:
    return str(tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=generation))


def _splice(rendered: str, marked: str, contents: list[tuple[str, str, int]]) -> list[Span] | None:
    """Spans of `contents` (sentinel, text, role) in `rendered`, if `marked` with each sentinel (once each)
    replaced by its text is exactly `rendered`; else None."""
    found = sorted((marked.find(m), m, text, role) for m, text, role in contents)
    if any(at < 0 or marked.count(m) != 1 for at, m, _, _ in found):
        return None
    out, pieces, pos, shift = [], [], 0, 0
    for at, m, text, role in found:
        pieces += [marked[pos:at], text]
        out.append((0, at + shift, at + shift + len(text), role))
        shift += len(text) - len(m)
        pos = at + len(m)
    return out if "".join([*pieces, marked[pos:]]) == rendered else None


def _one_at_a_time(tokenizer: PreTrainedTokenizerBase, conv: Conversation, rendered: str,
                   roles: list[int]) -> list[Span] | None:
    """Each message's content span from a render with only that content replaced by a sentinel."""
    out = []
    for k, role in enumerate(roles):
        marked = _render(tokenizer, [*conv[:k], {**conv[k], "content": _mark(k)}, *conv[k + 1:]], False)
        if marked.count(_mark(k)) != 1:
            return None
        before, after = marked.split(_mark(k))
        if not (rendered.startswith(before) and rendered.endswith(after) and len(before) + len(after) <= len(rendered)):
            return None
        out.append((0, len(before), len(rendered) - len(after), role))
    return out


def _conversation(tokenizer: PreTrainedTokenizerBase, conv: Conversation) -> tuple[str, list[Span] | None]:
    """A chat-templated conversation: its text and every content's span (the last assistant turn the response)."""
    roles = [RESPONSE if k == len(conv) - 1 and m["role"] == "assistant" else PROMPT for k, m in enumerate(conv)]
    rendered = _render(tokenizer, conv, False)
    marked = _render(tokenizer, [{**m, "content": _mark(k)} for k, m in enumerate(conv)], False)
    spans = _splice(rendered, marked, [(_mark(k), m["content"], r) for k, (m, r) in enumerate(zip(conv, roles))])
    return rendered, spans if spans is not None else _one_at_a_time(tokenizer, conv, rendered, roles)


def _parts(item: Text) -> tuple[list[str], str | None]:
    """The prompt messages' contents and the response (None when the conversation does not end with one)."""
    if isinstance(item, str):
        return [], item
    if item[-1]["role"] == "assistant":
        return [m["content"] for m in item[:-1]], item[-1]["content"]
    return [m["content"] for m in item], None


def _joined(texts: list[str], role: int, sep: str, seq: int = 0, start: int = 0) -> tuple[str, list[Span]]:
    """`sep.join(texts)` and each text's span in it (the separators are the template's)."""
    spans, pos = [], start
    for t in texts:
        spans.append((seq, pos, pos + len(t), role))
        pos += len(t) + len(sep)
    return sep.join(texts), spans


Layout = tuple[Callable[[], Any], list[Span] | None]
"""How the model's ids are encoded with offsets, and the contents' spans in that text."""


def _layout(tokenizer: PreTrainedTokenizerBase, item: Text, encoder: bool, question: str | None) -> Layout:
    """The text `model/_tokens.tokenize` encodes for `item` (asked `question` when a judge reads it), as
    an encoding call with offsets, and where the prompt's and response's contents lie in it."""
    def enc(*texts: str, special: bool) -> Callable[[], Any]:
        return lambda: tokenizer(*texts, add_special_tokens=special, return_offsets_mapping=True)

    templated = bool(getattr(tokenizer, "chat_template", None))
    prompts, response = _parts(item)
    if question is not None:  # a judge: one user turn asking the question (the generation prompt opened)
        contents = [(_mark(0), "\n".join(prompts), PROMPT), (_mark(1), response or "", RESPONSE)]
        real = question.format(prompt=contents[0][1], response=contents[1][1])
        asked = question.format(prompt=_mark(0), response=_mark(1))
        if not templated:
            return enc(real, special=True), _splice(real, asked, [c for c in contents if c[0] in asked])
        rendered = _render(tokenizer, [{"role": "user", "content": real}], True)
        marked = _render(tokenizer, [{"role": "user", "content": asked}], True)
        return enc(rendered, special=False), _splice(rendered, marked, [c for c in contents if c[0] in asked])
    if isinstance(item, str):
        return enc(item, special=True), [(0, 0, len(item), RESPONSE)]
    if templated:
        rendered, spans = _conversation(tokenizer, item)
        return enc(rendered, special=False), spans
    prompt, spans = _joined(prompts, PROMPT, "\n")
    if response is None:
        return enc(prompt, special=True), spans
    if encoder:  # a text pair: offsets count within each text, told apart by sequence ids
        return enc(prompt, response, special=True), [*spans, (1, 0, len(response), RESPONSE)]
    start = len(prompt) + len(JOIN)
    return enc(prompt + JOIN + response, special=True), [*spans, (0, start, start + len(response), RESPONSE)]


def _classify(encoding: Any, spans: list[Span]) -> np.ndarray:
    """Each token's role: the role of a content span its characters overlap, else the template's."""
    offsets = encoding["offset_mapping"]
    seq_ids = encoding.sequence_ids() if hasattr(encoding, "sequence_ids") else [0] * len(offsets)
    out = np.full(len(offsets), TEMPLATE, dtype=np.int8)
    for i, ((a, b), seq) in enumerate(zip(offsets, seq_ids)):
        for s, start, end, role in spans:
            if seq == s and b > a and a < end and b > start:
                out[i] = role
                break
    return out


def _aligned(full: list[int], roles: np.ndarray, ids: list[int], first: bool) -> np.ndarray | None:
    """`roles` of `full` moved onto `ids`: the same ids, or what a left cut keeps of them (`first`: and the
    first token); None when `ids` is neither."""
    n = len(ids)
    if ids == full:
        return roles
    if n < len(full) and not first and ids == full[len(full) - n:]:
        return roles[len(full) - n:]
    if 0 < n < len(full) and first and ids == full[:1] + full[len(full) - n + 1:]:
        return np.concatenate([roles[:1], roles[len(full) - n + 1:]])
    return None


def token_roles(tokenizer: PreTrainedTokenizerBase, item: Text, ids: list[int], *, encoder: bool,
                question: str | None = None) -> np.ndarray | None:
    """Each token's role code [len(ids)] (`ROLES`: template, prompt, response) in the sequence `ids` the
    model reads for `item` (a judge asked `question`), by the rule in this module's docstring; None
    when the contents cannot be located (the caller falls back to `by_special_ids`)."""
    if not isinstance(item, str) and not all(isinstance(m.get("content"), str) for m in item):
        return None  # contents given as parts (images, lists): no text to locate
    try:
        make, spans = _layout(tokenizer, item, encoder, question)
        if spans is None:
            return None
        encoding = make()
    except NotImplementedError:  # a slow tokenizer has no offset mapping
        return None
    full = list(encoding["input_ids"])
    return _aligned(full, _classify(encoding, spans), ids, first=encoder)


def by_special_ids(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> np.ndarray:
    """The fallback: special ids are the template's, every other token the response's."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return np.array([TEMPLATE if i in special else RESPONSE for i in ids], dtype=np.int8)


def roles_of(tokenizer: PreTrainedTokenizerBase, items: list[Text], seqs: list[list[int]], *, encoder: bool,
             question: str | None = None) -> list[np.ndarray]:
    """`token_roles` of every sequence, falling back to `by_special_ids` with one warning for those it cannot
    locate."""
    out, lost = [], []
    for i, (item, ids) in enumerate(zip(items, seqs)):
        roles = token_roles(tokenizer, item, ids, encoder=encoder, question=question)
        if roles is None:
            lost.append(i)
            roles = by_special_ids(tokenizer, ids)
        out.append(roles)
    if lost:
        warn(f"could not locate the prompt's and response's text in the tokens of {len(lost)} sequence(s) (first: "
             f"{lost[0]}; a tokenizer without offsets, or a template that rewrites the contents): there only special "
             "tokens count as the template's and every other token as the response's")
    return out
