"""What the policy monitor records: one `PolicyRecord` per scored batch, its `Alarm`s, and the
`PolicyRun` read back from the JSON-lines log."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataError
from ..plotting import HtmlView

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

REST, CONSTANT = "rest", "constant"
"""The two terms of a reward split that no bias direction owns (see `_gain`)."""


@dataclass(frozen=True)
class Alarm:
    """A bias that crossed its threshold with its whole 95% interval: `kind` 'direction' (share of
    the reward gain along a bias direction) or 'surface' (Spearman ρ of a surface statistic with
    reward over the window); `name` the direction or statistic, `axis` the probe axis it stands for
    (None for a user's own direction), `value` and `ci` the estimate, `since` the last baseline step."""

    kind: str
    name: str
    axis: str | None
    step: int
    since: int
    value: float
    ci: tuple[float, float]
    threshold: float

    @property
    def message(self) -> str:
        """The alarm in plain words."""
        lo, hi = self.ci
        if self.kind == "direction":
            return (f"reward gain since step {self.since} is {self.value:.0%} {self.name} direction "
                    f"(95% CI {lo:.0%}–{hi:.0%}, threshold {self.threshold:.0%})")
        return (f"reward tracks {self.name} (Spearman ρ {self.value:+.2f}, 95% CI {lo:+.2f} to {hi:+.2f}, "
                f"threshold {self.threshold:.2f}) over the batches up to step {self.step}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "axis": self.axis, "step": self.step, "since": self.since,
                "value": self.value, "ci": list(self.ci), "threshold": self.threshold, "message": self.message}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Alarm:
        return cls(d["kind"], d["name"], d["axis"], int(d["step"]), int(d["since"]), float(d["value"]),
                   (float(d["ci"][0]), float(d["ci"][1])), float(d["threshold"]))


def _clean(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def _arr(xs: Any) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] if isinstance(row, list) else
                     (np.nan if row is None else row) for row in xs], dtype=np.float64)


@dataclass(frozen=True)
class PolicyRecord:
    """One scored batch of `n` samples at `step`.

    Per sample: `rewards` [n] (what the reward function returned), `along` [n, m] the reward's part
    along each of `directions`, `rest` [n] and `constant` [n] the other two exact terms
    (`along.sum(1) + rest + constant == rewards`), `surface` [n, S] the statistics named by `stats`.
    Over the batches so far: `gain` (mean reward of the last `window` batches − that of the baseline
    batches, reward units; NaN while the baseline fills) and `gain_ci`; `share` [m + 2] and
    `share_ci` [m + 2, 2] each direction's, then `rest`'s and `constant`'s part of the gain (summing
    to 1); `rho` [S] and `rho_ci` [S, 2] Spearman ρ of each statistic with reward over the window;
    `since` the last baseline step. `parts`: each part's mean contribution on this batch (exact
    sublayer attribution, only on batches it ran on, else empty) and `top` the parts whose mean
    moved most since the first attributed batch: (part, now, first). `alarms` those raised here.
    """

    step: int
    rewards: np.ndarray
    directions: tuple[str, ...]
    along: np.ndarray
    rest: np.ndarray
    constant: np.ndarray
    stats: tuple[str, ...]
    surface: np.ndarray
    since: int = -1
    gain: float = np.nan
    gain_ci: tuple[float, float] = (np.nan, np.nan)
    share: np.ndarray = field(default_factory=lambda: np.zeros(0))
    share_ci: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    rho: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rho_ci: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    parts: dict[str, float] = field(default_factory=dict)
    top: tuple[tuple[str, float, float], ...] = ()
    alarms: tuple[Alarm, ...] = ()

    @property
    def terms(self) -> tuple[str, ...]:
        """Names of the gain's terms, in `share` order: the directions, `rest`, `constant`."""
        return (*self.directions, REST, CONSTANT)

    @property
    def metrics(self) -> dict[str, float]:
        """Flat scalars for a trainer's logger (`Trainer.log`, W&B, TensorBoard): reward, gain, each
        term's share of the gain, each statistic's mean and ρ with reward, and the alarm count.
        Undefined values (NaN) are left out, as loggers choke on them."""
        out = {"rewardlens/reward": float(np.mean(self.rewards)), "rewardlens/gain": self.gain,
               "rewardlens/alarms": float(len(self.alarms))}
        out.update({f"rewardlens/share/{t}": float(s) for t, s in zip(self.terms, self.share)})
        out.update({f"rewardlens/along/{d}": float(v) for d, v in zip(self.directions, self.along.mean(0))})
        out.update({f"rewardlens/surface/{s}": float(v) for s, v in zip(self.stats, self.surface.mean(0))})
        out.update({f"rewardlens/rho/{s}": float(r) for s, r in zip(self.stats, self.rho)})
        return {k: v for k, v in out.items() if np.isfinite(v)}

    def to_json(self) -> str:
        """One JSON line (NaN written as null)."""
        lists = lambda a: [[_clean(v) for v in row] for row in np.asarray(a)]  # noqa: E731
        return json.dumps({
            "step": self.step, "rewards": [_clean(v) for v in self.rewards], "directions": list(self.directions),
            "along": lists(self.along), "rest": [_clean(v) for v in self.rest],
            "constant": [_clean(v) for v in self.constant], "stats": list(self.stats), "surface": lists(self.surface),
            "since": self.since, "gain": _clean(self.gain), "gain_ci": [_clean(v) for v in self.gain_ci],
            "share": [_clean(v) for v in self.share], "share_ci": lists(self.share_ci),
            "rho": [_clean(v) for v in self.rho], "rho_ci": lists(self.rho_ci),
            "parts": {k: _clean(v) for k, v in self.parts.items()}, "top": [list(t) for t in self.top],
            "alarms": [a.to_dict() for a in self.alarms],
        })

    @classmethod
    def from_json(cls, line: str) -> PolicyRecord:
        d = json.loads(line)
        n, m, s = len(d["rewards"]), len(d["directions"]), len(d["stats"])
        nan = lambda v: np.nan if v is None else float(v)  # noqa: E731
        return cls(
            int(d["step"]), _arr(d["rewards"]), tuple(d["directions"]), _arr(d["along"]).reshape(n, m),
            _arr(d["rest"]), _arr(d["constant"]), tuple(d["stats"]), _arr(d["surface"]).reshape(n, s),
            int(d["since"]), nan(d["gain"]), (nan(d["gain_ci"][0]), nan(d["gain_ci"][1])), _arr(d["share"]),
            _arr(d["share_ci"]).reshape(-1, 2), _arr(d["rho"]), _arr(d["rho_ci"]).reshape(-1, 2),
            {k: nan(v) for k, v in d["parts"].items()}, tuple((str(a), float(b), float(c)) for a, b, c in d["top"]),
            tuple(Alarm.from_dict(a) for a in d["alarms"]),
        )


@dataclass(frozen=True)
class PolicyRun(HtmlView):
    """Every record of a monitored policy run, in order (`PolicyRun.from_jsonl(log)` reads a log back)."""

    records: tuple[PolicyRecord, ...]

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> PolicyRun:
        """Read a policy monitor's log; a last line cut short by a crash is skipped."""
        lines = [x for x in Path(path).read_text().splitlines() if x.strip()]
        records = []
        for i, line in enumerate(lines):
            try:
                records.append(PolicyRecord.from_json(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                if i < len(lines) - 1:
                    raise DataError(f"{path}: line {i + 1} is not a policy monitor record ({exc}); only the last "
                                    "line may be cut short by a crash — was it written by rewardlens.monitor?"
                                    ) from None
        if not records:
            raise DataError(f"{path} holds no policy monitor record; pass the log= file of monitored_reward "
                            "or PolicyMonitor")
        return cls(tuple(records))

    def __len__(self) -> int:
        return len(self.records)

    @property
    def steps(self) -> np.ndarray:
        return np.array([r.step for r in self.records], dtype=np.int64)

    @property
    def terms(self) -> tuple[str, ...]:
        return self.records[0].terms

    @property
    def alarms(self) -> list[Alarm]:
        """The first alarm of each (kind, name), in the order they were raised."""
        seen: dict[tuple[str, str], Alarm] = {}
        for r in self.records:
            for a in r.alarms:
                seen.setdefault((a.kind, a.name), a)
        return list(seen.values())

    def to_frame(self) -> pd.DataFrame:
        """One row per record (index `step`): mean reward, gain and its interval, `share/<term>`,
        `surface/<stat>` (batch mean) and `rho/<stat>`, and the number of alarms raised."""
        import pandas as pd

        rows = []
        for r in self.records:
            row: dict[str, float] = {"reward": float(np.mean(r.rewards)), "gain": r.gain, "gain_lo": r.gain_ci[0],
                                     "gain_hi": r.gain_ci[1], "alarms": float(len(r.alarms))}
            row.update({f"share/{t}": float(s) for t, s in zip(r.terms, r.share)} if len(r.share) else {})
            row.update({f"surface/{s}": float(v) for s, v in zip(r.stats, r.surface.mean(0))})
            row.update({f"rho/{s}": float(v) for s, v in zip(r.stats, r.rho)} if len(r.rho) else {})
            rows.append(row)
        return pd.DataFrame(rows, index=pd.Index(self.steps, name="step"))

    def plot(self, ax: Sequence[Axes] | None = None) -> Figure:
        """Mean reward over steps with the alarms marked (left), and each term's share of the gain (right).
        `ax`: two axes (left, right) to draw into (their figure is returned), else a new figure."""
        from ..plotting import finish, panels

        frame = self.to_frame()
        (left, right), made = panels(ax, (1, 2), (10, 3.5), "PolicyRun.plot")
        left.plot(frame.index, frame["reward"], marker=".")
        for a in self.alarms:
            left.axvline(a.step, color="tab:red", lw=0.8)
        left.set_xlabel("step")
        left.set_ylabel("mean reward")
        for t in self.terms:
            if f"share/{t}" in frame:
                right.plot(frame.index, frame[f"share/{t}"], marker=".", label=t)
        right.set_xlabel("step")
        right.set_ylabel("share of the reward gain")
        right.legend(fontsize="small")
        return finish(left, made)


def top_moved(now: dict[str, float], first: dict[str, float], k: int) -> tuple[tuple[str, float, float], ...]:
    """The `k` parts whose mean contribution moved most from `first` to `now`: (part, now, first)."""
    names: Sequence[str] = sorted(now, key=lambda p: -abs(now[p] - first.get(p, 0.0)))
    return tuple((p, now[p], first.get(p, 0.0)) for p in names[:k])
