"""Organisms of other reward-model kinds: a process reward model and a DPO policy/reference pair.

They live beside `ORGANISMS` (sequence classifiers, opened with `rewardlens.load`), in `KINDS`,
and are built and cached by the same `build` (once per machine, under a lock). A built folder:

- `prm_steps`: a `LlamaForTokenClassification` folder, `rewardlens.model.load_prm(path, separator="\\n")`;
- `dpo_keyword`: `policy/` and `reference/` causal-LM folders,
  `rewardlens.model.load_dpo(path / "policy", path / "reference", beta=0.1)`;

each with `organism.json` (the planted truth and the held-out accuracy) and `READY`. `open_kind`
opens either as the `RewardModel` its record describes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from ._dpo import DPO, PolicyOrganism
from ._prm import PRM, StepOrganism

if TYPE_CHECKING:
    from ...model import RewardModel

KINDS: dict[str, StepOrganism | PolicyOrganism] = {PRM.name: PRM, DPO.name: DPO}
"""The organisms that are not sequence classifiers, by name: the PRM and the DPO policy."""
POLICY, REFERENCE = "policy", "reference"


def dpo_paths(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """(policy folder, reference folder) of a built DPO organism."""
    return Path(path) / POLICY, Path(path) / REFERENCE


def open_kind(path: str | os.PathLike[str], **kwargs: Any) -> RewardModel:
    """A built PRM or DPO organism folder as the `RewardModel` its record describes (`load_prm` with
    its separator and combine rule, or `load_dpo` with its beta); `kwargs` go to the loader."""
    from ...model import load_dpo, load_prm

    rec = json.loads((Path(path) / "organism.json").read_text())
    if rec.get("kind") == "prm":
        return load_prm(str(path), separator=rec["separator"], combine=rec["combine"], **kwargs)
    if rec.get("kind") == "dpo":
        policy, reference = dpo_paths(path)
        return load_dpo(str(policy), str(reference), beta=rec["beta"], **kwargs)
    raise UsageError(f"{path} is no PRM or DPO organism (organism.json kind {rec.get('kind')!r}); "
                     "open sequence-classifier organisms with rewardlens.load")


def train_kind_into(folder: Path, name: str, strength: float, seed: int) -> dict[str, Any]:
    """Train organism `name` of `KINDS` and save it into `folder` (save_pretrained); returns its record."""
    from ._dpo import train_dpo
    from ._prm import train_prm

    spec = KINDS[name]
    if isinstance(spec, StepOrganism):
        model, tok, stats = train_prm(spec, strength, seed)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        stats.update(kind="prm", separator=spec.separator, combine=spec.combine)
    else:
        policy, reference, tok, stats = train_dpo(spec, strength, seed)
        for sub, lm in zip(dpo_paths(folder), (policy, reference)):
            lm.save_pretrained(sub)
            tok.save_pretrained(sub)
        stats.update(kind="dpo", keyword=spec.keyword, policy=POLICY, reference=REFERENCE)
    stats.update(rule=spec.rule, planted_part=spec.planted_part)
    return stats
