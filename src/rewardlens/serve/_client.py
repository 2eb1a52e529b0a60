"""Clients of the reward server, on the standard library alone (`urllib`): `Client` for any loop, and
`RemoteReward`, a TRL reward function (`reward_funcs=`) with `rewardlens.monitor.monitored_reward`'s signature whose
monitoring happens on the server.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any


class ServerError(RuntimeError):
    """The server answered with an error status (`status`) and its one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"reward server answered {status}: {message}")
        self.status = status


class Client:
    """Talks to `rewardlens serve` at `url` (e.g. "http://127.0.0.1:8000"). A 503 (queue full) is retried up
    to `retries` times, waiting what the server's `Retry-After` says; every other error raises `ServerError`."""

    def __init__(self, url: str = "http://127.0.0.1:8000", *, timeout: float = 600.0, retries: int = 20) -> None:
        self.url, self.timeout, self.retries = url.rstrip("/"), timeout, retries

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.url + path, data=data, method="GET" if body is None else "POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                    raw = answer.read()
                    kind = answer.headers.get("Content-Type", "")
                    return json.loads(raw) if kind.startswith("application/json") else raw.decode()
            except urllib.error.HTTPError as exc:
                text = exc.read().decode(errors="replace")
                if exc.code == 503 and attempt < self.retries:
                    time.sleep(float(exc.headers.get("Retry-After") or 1))
                    continue
                try:
                    message = json.loads(text).get("error", text)
                except ValueError:
                    message = text
                raise ServerError(exc.code, str(message)) from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def get_reward(self, queries: Sequence[str], prompts: Sequence[str] | None = None,
                   labels: Sequence[Any] | None = None, step: int | None = None) -> list[float]:
        """OpenRLHF's protocol: the rewards of full texts `queries` (prompt + response)."""
        body: dict[str, Any] = {"query": list(queries)}
        if prompts is not None:
            body["prompts"] = list(prompts)
        if labels is not None:
            body["labels"] = list(labels)
        if step is not None:
            body["step"] = int(step)
        return list(self._call("/get_reward", body)["rewards"])

    def score(self, prompts: Sequence[Any], responses: Sequence[str], step: int | None = None) -> list[float]:
        """The rewards of (prompt, response) records: a prompt is a string (one user turn) or a list of
        `{"role", "content"}` messages; the monitor sees them, at `step` when given."""
        body: dict[str, Any] = {"records": [{"prompt": p, "response": r} for p, r in zip(prompts, responses)]}
        if step is not None:
            body["step"] = int(step)
        return list(self._call("/score", body)["rewards"])

    def score_pairs(self, pairs: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
        """Preference pair records (any schema `load_pairs` reads): {"chosen": [...], "rejected": [...]}."""
        out = self._call("/score", {"pairs": list(pairs)})
        return {"chosen": out["chosen"], "rejected": out["rejected"]}

    def health(self) -> dict[str, Any]:
        return dict(self._call("/health"))

    def alarms(self) -> dict[str, Any]:
        """The monitor's records and alarms so far (`GET /alarms`)."""
        return dict(self._call("/alarms"))

    def metrics(self) -> str:
        """`GET /metrics`, Prometheus' text format."""
        return str(self._call("/metrics"))


def _record(prompt: Any, completion: Any) -> tuple[Any, str]:
    """(prompt, response) of one TRL sample: strings as they are; conversational messages as the prompt's
    messages plus all but the completion's last, and that last message's text as the response."""
    if isinstance(completion, list):
        head, last = completion[:-1], completion[-1]
        turns = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        return turns + [dict(m) for m in head], str(last["content"])
    return (prompt if isinstance(prompt, list) else str(prompt)), str(completion)


class RemoteReward:
    """A TRL reward function (`prompts`, `completions`, `**kwargs` → one float per completion) scoring on a
    reward server, so its monitor sees the samples at TRL's `trainer_state.global_step` (else the number of
    calls so far)."""

    __name__ = "rewardlens"  # what TRL names the reward in its logs, as for monitored_reward

    def __init__(self, client: Client) -> None:
        self.client, self.calls = client, 0

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        state = kwargs.get("trainer_state")
        step = int(state.global_step) if state is not None else self.calls
        self.calls += 1
        records = [_record(p, c) for p, c in zip(prompts, completions)]
        rewards = self.client.score([p for p, _ in records], [r for _, r in records], step=step)
        return [float("nan") if r is None else float(r) for r in rewards]


def remote_reward(url: str = "http://127.0.0.1:8000", **client_options: Any) -> RemoteReward:
    """A TRL reward function calling the reward server at `url` (`Client` options: `timeout=`, `retries=`)."""
    return RemoteReward(Client(url, **client_options))
