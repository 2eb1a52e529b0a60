"""The content view of a token attribution: the response's tokens and the prompt's, the template's grouped.

Each source token has a role (model/_roles.py: the template's, a prompt message's or the response's
text). Grouping the exact direct split by role keeps it exact:

    reward = Σ_{s ∈ response} T(s) + Σ_{s ∈ prompt} T(s) + Σ_{s ∈ template} T(s) + at_read + constant

so the content view lists the response's and the prompt's tokens one by one, and the template's
(role headers, special ids, separators, and the read token when the template writes it) as one row;
`at_read` (written at the read token itself) and `constant` close it. A row's share is its value over
the reward, signed, so the shares sum to 100 %; it is ill-conditioned when the reward is small against
its terms (`ill_conditioned`), and then only the values should be read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..model.internal import ROLES

if TYPE_CHECKING:
    import pandas as pd

GROUPS: tuple[str, ...] = ("response", "prompt", "template", "at_read", "constant")
"""The rows the reward is grouped into, in this order; their values sum to the reward."""
ILL_CONDITIONED = 0.1
"""Shares of the reward are flagged when |reward| is under this fraction of Σ|group values|."""


def group_values(values: np.ndarray, roles: np.ndarray, at_read: float, constant: float) -> dict[str, float]:
    """Σ of the direct split per role, plus `at_read` and `constant`: keys `GROUPS`, summing to the reward."""
    out = {name: float(values[roles == code].sum()) for code, name in enumerate(ROLES)}
    return {g: out[g] if g in out else {"at_read": at_read, "constant": constant}[g] for g in GROUPS}


def ill_conditioned(groups: dict[str, float]) -> bool:
    """Whether the reward is small against its groups, so that shares of it swing (see `ILL_CONDITIONED`)."""
    reward, scale = sum(groups.values()), sum(abs(v) for v in groups.values())
    return bool(abs(reward) < ILL_CONDITIONED * scale)


def content_frame(tokens: list[str], values: np.ndarray, roles: np.ndarray, approx: np.ndarray | None,
                  at_read: float, constant: float) -> pd.DataFrame:
    """One row's content view: every response token, then every prompt token (in order), then one row each
    for the template's tokens, `at_read` and `constant`; `value` sums to the reward, `share` is value / reward."""
    import pandas as pd

    groups = group_values(values, roles, at_read, constant)
    reward = sum(groups.values())
    rows: list[dict[str, object]] = []
    for code in (ROLES.index("response"), ROLES.index("prompt")):
        for pos in np.flatnonzero(roles == code):
            rows.append({"role": ROLES[code], "position": int(pos), "token": tokens[pos], "value": float(values[pos]),
                         **({} if approx is None else {"total_approx": float(approx[pos])})})
    template = roles == ROLES.index("template")
    rows.append({"role": "template", "position": -1, "token": f"({int(template.sum())} template tokens)",
                 "value": groups["template"],
                 **({} if approx is None else {"total_approx": float(approx[template].sum())})})
    for name in ("at_read", "constant"):
        rows.append({"role": name, "position": -1, "token": "", "value": groups[name],
                     **({} if approx is None else {"total_approx": float("nan")})})
    frame = pd.DataFrame(rows)
    frame["share"] = frame["value"] / reward if reward != 0 else float("nan")
    return frame
