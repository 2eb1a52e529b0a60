"""What the monitor records: one `Snapshot` per measured step, and the `Trajectory` of a run."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..data import margin
from ..errors import DataError
from ..model.internal import PART_KINDS as KINDS
from ..plotting import HtmlView
from ..stats import ranked

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

GROUPS = KINDS
LENS_METRICS = ("accuracy", "margin", "crystallization_linear", "crystallization_normed")
METRICS = LENS_METRICS + ("closure_error",) + tuple(f"margin_{g}" for g in GROUPS) + tuple(f"share_{g}" for g in GROUPS)
"""Per-snapshot scalars, in this order (see `snapshot`)."""


@dataclass(frozen=True)
class Snapshot:
    """One step's measurements. `metrics` maps each name of `METRICS` to a float; `rewards` [2n]
    is the lens' final value (= the model's reward) per sequence, chosen and rejected interleaved;
    `part_margin` [P] each part's mean chosen − rejected contribution (reward units);
    `probe_effect` [A] each probe axis' mean effect (reward units, with − without)."""

    step: int
    metrics: dict[str, float]
    rewards: np.ndarray
    parts: tuple[str, ...]
    part_margin: np.ndarray
    axes: tuple[str, ...] = ()
    probe_effect: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def to_json(self) -> str:
        """One JSON line (NaN written as null)."""
        clean = lambda x: None if not np.isfinite(x) else float(x)
        return json.dumps({
            "step": self.step, "metrics": {k: clean(v) for k, v in self.metrics.items()},
            "rewards": [clean(x) for x in self.rewards], "parts": dict(zip(self.parts, map(clean, self.part_margin))),
            "probes": dict(zip(self.axes, map(clean, self.probe_effect))),
        })

    @classmethod
    def from_json(cls, line: str) -> Snapshot:
        rec = json.loads(line)
        arr = lambda xs: np.array([np.nan if x is None else x for x in xs], dtype=np.float64)
        return cls(int(rec["step"]), {k: np.nan if v is None else float(v) for k, v in rec["metrics"].items()},
                   arr(rec["rewards"]), tuple(rec["parts"]), arr(rec["parts"].values()),
                   tuple(rec["probes"]), arr(rec["probes"].values()))


@dataclass(frozen=True)
class Trajectory(HtmlView):
    """Snapshots over training: `steps` [T]; `values` [T, M] the scalars named by `metrics`;
    `rewards` [T, 2n] per-sequence rewards; `part_margin` [T, P] per-part mean margin contribution
    (parts named by `parts`); `probe_effect` [T, A] per-axis mean probe effect (axes named by `axes`).
    Reward units throughout; crystallization depths as l / L; shares in [-1, 1]."""

    steps: np.ndarray
    metrics: tuple[str, ...]
    values: np.ndarray
    rewards: np.ndarray
    parts: tuple[str, ...]
    part_margin: np.ndarray
    axes: tuple[str, ...]
    probe_effect: np.ndarray

    @classmethod
    def from_snapshots(cls, snaps: Sequence[Snapshot]) -> Trajectory:
        snaps = list(snaps)
        first = snaps[0] if snaps else Snapshot(0, {m: np.nan for m in METRICS}, np.zeros(0), (), np.zeros(0))
        for s in snaps:
            if s.parts != first.parts or s.axes != first.axes or len(s.rewards) != len(first.rewards):
                raise DataError(f"snapshot at step {s.step} measured other parts, axes or pairs than the one at "
                                f"step {first.step}; a trajectory needs the same pairs and options throughout")
        stack = lambda rows, width: np.array(rows, dtype=np.float64).reshape(len(snaps), width)
        return cls(
            steps=np.array([s.step for s in snaps], dtype=np.int64), metrics=METRICS,
            values=stack([[s.metrics[m] for m in METRICS] for s in snaps], len(METRICS)),
            rewards=stack([s.rewards for s in snaps], len(first.rewards)), parts=first.parts,
            part_margin=stack([s.part_margin for s in snaps], len(first.parts)), axes=first.axes,
            probe_effect=stack([s.probe_effect for s in snaps], len(first.axes)),
        )

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> Trajectory:
        """Read the lines a `Monitor(path=...)` wrote; a last line cut short by a crash is skipped."""
        lines = [x for x in Path(path).read_text().splitlines() if x.strip()]
        snaps = []
        for i, line in enumerate(lines):
            try:
                snaps.append(Snapshot.from_json(line))
            except (json.JSONDecodeError, KeyError) as exc:
                if i < len(lines) - 1:
                    raise DataError(f"{path}: line {i + 1} is not a monitor snapshot ({exc}); only the last line "
                                    "may be cut short by a crash — was the file written by rewardlens.monitor.Monitor?"
                                    ) from None
        return cls.from_snapshots(snaps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, name: str) -> np.ndarray:
        """A metric's values [T] by name, or a probe axis' effect as `probe/<axis>`."""
        if name in self.metrics:
            return self.values[:, self.metrics.index(name)]
        if name.startswith("probe/") and name[6:] in self.axes:
            return self.probe_effect[:, self.axes.index(name[6:])]
        raise KeyError(f"no metric {name!r}; metrics: {list(self.metrics)} and probe/<axis> for axes {list(self.axes)}")

    @property
    def margins(self) -> np.ndarray:
        """Per-pair final margins [T, n] (chosen − rejected reward)."""
        return margin(self.rewards, axis=1)

    def top(self, n: int = 5, at: int = -1) -> list[tuple[str, float]]:
        """The `n` parts with the largest |mean margin contribution| at snapshot index `at` (NaN last, ties
        in part order: `stats.ranked`)."""
        row = self.part_margin[at]
        return [(self.parts[i], float(row[i])) for i in ranked(np.abs(row), n)]

    def to_frame(self) -> pd.DataFrame:
        """One row per snapshot (index `step`): every metric, then `probe/<axis>` columns."""
        import pandas as pd

        cols = {m: self.values[:, i] for i, m in enumerate(self.metrics)}
        cols.update({f"probe/{a}": self.probe_effect[:, i] for i, a in enumerate(self.axes)})
        return pd.DataFrame(cols, index=pd.Index(self.steps, name="step"))

    def parts_frame(self) -> pd.DataFrame:
        """Per-part mean margin contribution: one row per snapshot, one column per part."""
        import pandas as pd

        return pd.DataFrame(self.part_margin, columns=list(self.parts), index=pd.Index(self.steps, name="step"))

    def plot(self, ax: Sequence[Axes] | None = None) -> Figure:
        """Curves against step, one panel each: margin and accuracy (on a twin axis), crystallization
        depths, margin shares and, when probes were run, probe effects. `ax`: those 3 (4 with probes)
        axes to draw into (their figure is returned), else a new figure."""
        from ..plotting import finish, panels

        n = 4 if self.axes else 3
        axs, made = panels(ax, (1, n), (4 * n, 3.2), f"Trajectory.plot (probes: {list(self.axes)})")
        axs[0].plot(self.steps, self["margin"], marker="o", label="mean margin")
        twin = axs[0].twinx()
        twin.plot(self.steps, self["accuracy"], color="tab:green", marker=".", label="accuracy")
        twin.set_ylim(0, 1.05)
        axs[0].set_ylabel("margin (reward units)")
        twin.set_ylabel("accuracy")
        for kind in ("linear", "normed"):
            axs[1].plot(self.steps, self[f"crystallization_{kind}"], marker="o", label=f"{kind} lens")
        axs[1].set_ylabel("median crystallization depth (l / L)")
        axs[1].set_ylim(-0.05, 1.05)
        for g in GROUPS:
            axs[2].plot(self.steps, self[f"share_{g}"], marker="o", label=g)
        axs[2].set_ylabel("share of margin")
        for a in self.axes:
            axs[3].plot(self.steps, self[f"probe/{a}"], marker="o", label=a)
        if self.axes:
            axs[3].set_ylabel("probe effect (reward units)")
        for panel in axs:
            panel.set_xlabel("step")
            panel.legend(fontsize="small")
        return finish(axs[0], made)
