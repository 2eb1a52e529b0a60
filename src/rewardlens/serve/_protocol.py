"""What a request to the reward server may hold, read into one `Job`: OpenRLHF's remote-RM body and the
native one, each refused with a one-line 4xx naming the field (`RequestError`) before it queues.

**OpenRLHF** (`POST /get_reward`, as `openrlhf.cli.serve_rm` reads it): `{"query": [str], "prompts":
[str], "labels": [...]}`. Each `query` is the full text the policy's tokenizer decoded: prompt (with
the trainer's chat template already applied, when it applies one) + response, possibly with padding
around it. The pad token's text is stripped from both ends, as OpenRLHF's own server does; the
response is the query after its `prompts` entry (when the query starts with it). What the model reads:

- `query="text"` (default): the stripped query as one string, tokenized as `RewardModel.score` tokenizes
  a string (the reward model's special tokens added; no template applied, as the text already has the
  policy's). The reward equals `model.score([query])`.
- `query="chat"`: the conversation [user: prompt, assistant: response], so the reward model's own chat
  template applies; for a trainer that sends plain prompts (no `--apply_chat_template`) or a policy whose
  template differs from the reward model's. Every query must then start with its prompt.

`labels` are accepted and ignored (a reward model reads no reference answer).

**Native** (`POST /score`): `{"records": [{"prompt": str | messages, "response": str}]}` (a policy's
samples: monitored, as TRL's reward functions see them) or `{"pairs": [...]}` (preference pairs in any
schema `rewardlens.load_pairs` reads; scored, chosen and rejected interleaved, never monitored: they are
not the policy's samples). Either body may carry `"step"` (the trainer's step, ≥ 0) that the monitor
rolls by.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..data import Pair, pairs_from_records
from ..errors import DataError
from ..types import Text

QueryAs = Literal["text", "chat"]


class RequestError(DataError):
    """A request the server refuses, with the HTTP status it answers (400 malformed, 413 too large,
    422 over a length limit, 503 busy) and, for 503, how many seconds to wait."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclass
class Job:
    """One request's work: `items` what the model reads (texts or conversations), `texts` the completions
    the monitor's surface statistics count, whether the monitor sees them, the caller's `step` (None: roll
    by time), and whether the items are pairs (rewards interleaved chosen, rejected)."""

    items: list[Text]
    texts: list[str]
    monitored: bool
    step: int | None
    pairs: bool = False


@dataclass(frozen=True)
class Limits:
    """What one request may hold: `max_bytes` of body, `max_items` sequences."""

    max_bytes: int = 8 << 20
    max_items: int = 4096


def parse_body(raw: bytes, limits: Limits) -> dict[str, Any]:
    """The JSON object of a request body; 413 over `max_bytes`, 400 if it is not a JSON object."""
    if len(raw) > limits.max_bytes:
        raise RequestError(413, f"request body is {len(raw)} bytes, over the server's --max-request-bytes "
                                f"{limits.max_bytes}; split the batch into smaller requests")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RequestError(400, f"request body is not JSON ({type(exc).__name__}: {str(exc)[:80]}); send a "
                                "JSON object") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"request body is a JSON {_kind(body)}, not an object; send {{\"query\": [...]}}")
    return body


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _strings(body: dict[str, Any], field: str, *, required: bool) -> list[str] | None:
    value = body.get(field)
    if value is None:
        if required:
            raise RequestError(400, f"field {field!r} is missing; send a list of strings")
        return None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        listed = isinstance(value, list)
        bad = next((i for i, x in enumerate(value) if not isinstance(x, str)), None) if listed else None
        where = f" (item {bad} is a {_kind(value[bad])})" if bad is not None else f" (got a {_kind(value)})"
        raise RequestError(400, f"field {field!r} must be a list of strings{where}")
    return value


def _step(body: dict[str, Any]) -> int | None:
    step = body.get("step")
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) or step < 0 \
            or int(step) != step:
        raise RequestError(400, f"field 'step' must be a whole number >= 0 (the trainer's step), got {step!r}")
    return int(step)


def _count(n: int, field: str, limits: Limits) -> None:
    if n == 0:
        raise RequestError(400, f"field {field!r} is empty; send at least one item")
    if n > limits.max_items:
        raise RequestError(413, f"field {field!r} holds {n} items, over the server's --max-request-items "
                                f"{limits.max_items}; split the batch into smaller requests")


def strip_pad(text: str, pad: str | None) -> str:
    """`text` without the pad token's text repeated at either end (a decoded, padded sequence)."""
    if not pad:
        return text
    while text.startswith(pad):
        text = text[len(pad):]
    while text.endswith(pad):
        text = text[: -len(pad)]
    return text


def openrlhf_job(body: dict[str, Any], limits: Limits, pad: str | None, query_as: QueryAs) -> Job:
    """The job of an OpenRLHF `/get_reward` body (module docstring: how the prompt is split off)."""
    queries = _strings(body, "query", required=True)
    assert queries is not None
    _count(len(queries), "query", limits)
    prompts = _strings(body, "prompts", required=False)
    if prompts is not None and len(prompts) != len(queries):
        raise RequestError(400, f"field 'prompts' has {len(prompts)} items but 'query' has {len(queries)}; send "
                                "one prompt per query")
    labels = body.get("labels")
    if labels is not None and (not isinstance(labels, list) or len(labels) != len(queries)):
        raise RequestError(400, f"field 'labels' must be a list with one item per query ({len(queries)})")
    step = _step(body)
    texts = [strip_pad(q, pad) for q in queries]
    prompt_texts = [strip_pad(p, pad) for p in prompts] if prompts is not None else [""] * len(texts)
    responses = [t[len(p):] if p and t.startswith(p) else t for t, p in zip(texts, prompt_texts)]
    if query_as == "text":
        return Job(list(texts), responses, True, step)
    if prompts is None:
        raise RequestError(400, "field 'prompts' is missing; this server reads each query as a chat (--query chat) "
                                "and needs the prompt to split it off")
    bad = [i for i, (t, p) in enumerate(zip(texts, prompt_texts)) if not t.startswith(p)]
    if bad:
        raise RequestError(422, f"query {bad[0]} does not start with its prompt; with --query chat each query must be "
                                "prompt + response")
    items: list[Text] = [[{"role": "user", "content": p}, {"role": "assistant", "content": r}]
                         for p, r in zip(prompt_texts, responses)]
    return Job(items, responses, True, step)


def _message_list(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        raise RequestError(400, f"{where} must be a string or a non-empty list of {{\"role\", \"content\"}} "
                                "string messages")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _record(record: Any, i: int) -> tuple[Text, str]:
    """(conversation, response) of one (prompt, response) record, read as `rewardlens.Pair` reads a side:
    a string prompt is one user turn, a list is the messages before the response."""
    if not isinstance(record, dict):
        raise RequestError(400, f"field 'records' item {i} is a {_kind(record)}; send {{\"prompt\", \"response\"}}")
    for field in ("prompt", "response"):
        if field not in record:
            raise RequestError(400, f"field 'records' item {i} has no {field!r}")
    response = record["response"]
    if not isinstance(response, str):
        raise RequestError(400, f"field 'records' item {i} 'response' must be a string, got a {_kind(response)}")
    prompt = record["prompt"]
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else \
        _message_list(prompt, f"field 'records' item {i} 'prompt'")
    return [*turns, {"role": "assistant", "content": response}], response


def native_job(body: dict[str, Any], limits: Limits) -> Job:
    """The job of a native `/score` body: `records` (monitored) or `pairs` (not)."""
    step = _step(body)
    if ("records" in body) == ("pairs" in body):
        raise RequestError(400, "send exactly one of the fields 'records' (prompt, response) or 'pairs' (preference "
                                "pairs)")
    if "records" in body:
        records = body["records"]
        if not isinstance(records, list):
            raise RequestError(400, f"field 'records' must be a list, got a {_kind(records)}")
        _count(len(records), "records", limits)
        read = [_record(r, i) for i, r in enumerate(records)]
        return Job([c for c, _ in read], [t for _, t in read], True, step)
    records = body["pairs"]
    if not isinstance(records, list):
        raise RequestError(400, f"field 'pairs' must be a list, got a {_kind(records)}")
    _count(2 * len(records), "pairs", limits)
    try:
        pairs = pairs_from_records(records, where="field 'pairs'")
    except (DataError, TypeError, ValueError) as exc:
        raise RequestError(400, str(exc).splitlines()[0]) from None
    _count(2 * len(pairs), "pairs", limits)  # a RewardBench 2 record may hold several pairs
    return Job(_sides(pairs), [t for p in pairs for t in (p.chosen, p.rejected)], False, step, pairs=True)


def _sides(pairs: Sequence[Pair]) -> list[Text]:
    return [p.conversation(side) for p in pairs for side in ("chosen", "rejected")]
