"""`ReadCache`: what the head reads of each distinct sequence, read once and shared between instruments.

The probes score every distinct conversation their items need; the concept directions read, at every
depth, the axes' with/without conversations: the same conversations. A cache shared by the two reads
each distinct sequence once, at every depth and with its readout vector (`RewardModel.read`), and
hands each caller the rows it asks for. A sequence is known by its token ids (and token type ids), so
two inputs that render alike are one read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import UsageError
from ._reading import Reading
from ._shared_reads import read_sharing
from ._tokens import Tokenized

if TYPE_CHECKING:  # annotations only: the core imports nothing of this module
    from ._core import RewardModel

_Key = tuple[tuple[int, ...], tuple[int, ...] | None]


def _key(seq: Tokenized) -> _Key:
    return tuple(seq.ids), None if seq.type_ids is None else tuple(seq.type_ids)


class ReadCache:
    """Readings of one `RewardModel`, by sequence: every depth (`labels`: "embed", "0" … "L-1") and the
    readout vector, on the model's device (fp32). Memory: (L + 4) · d + 2k floats per distinct sequence.

    Pass one to `probe(..., cache=)` and `concepts(..., cache=)` (the audit does): a sequence either has
    read is not read again."""

    def __init__(self, model: RewardModel) -> None:
        self.model = model
        self.labels: tuple[str, ...] = ("embed", *map(str, range(model.n_layers)))
        self._rows: dict[_Key, int] = {}
        self._parts: list[Reading] = []

    def __len__(self) -> int:
        """Distinct sequences read so far."""
        return len(self._rows)

    def check(self, model: RewardModel, what: str) -> None:
        """`ValueError` unless this cache reads `model` (a cache holds one model's readings)."""
        if model is not self.model:
            raise UsageError(f"{what}: the cache holds readings of {self.model!r}, not of {model!r}; pass a "
                             "ReadCache made for this model (ReadCache(model)) or none")

    def read(self, seqs: list[Tokenized], *, batch_size: int = 16,
             step: Callable[[int], object] | None = None) -> Reading:
        """The reading of `seqs` (rows in their order; `Reading.layers` holds every label). Sequences not
        read before are read in one call, in length-sorted batches of `batch_size` (so a prompt's variants all
        meet as one family, `read_sharing`); `step(n)` as each `n` are read."""
        keys = [_key(s) for s in seqs]
        first = {k: s for k, s in zip(keys, seqs) if k not in self._rows}
        new = sorted(first, key=lambda k: len(k[0]))
        if new:
            self._add(new, read_sharing(self.model, [first[k] for k in new], layers=self.labels,
                                        batch_size=batch_size, readout=True, step=step))
        held = self._joined()
        if held is None:  # nothing asked for, nothing read
            return self.model.read([], layers=self.labels, batch_size=batch_size, readout=True)
        index = torch.as_tensor([self._rows[k] for k in keys], dtype=torch.long, device=held.final.device)
        return Reading(held.final[index], held.hidden[index], {k: v[index] for k, v in held.layers.items()},
                       held.values[index], held.coefficients[index], _readout(held)[index])

    @staticmethod
    def arrays(got: Reading) -> dict[str, Any]:
        """A reading this cache returned, as fp32 numpy arrays that a results store keeps and `keep` takes back."""
        cpu = lambda t: t.detach().float().cpu().numpy()
        layers = {k: cpu(v) for k, v in got.layers.items()}
        return {"final": cpu(got.final), "hidden": cpu(got.hidden), "layers": layers, "values": cpu(got.values),
                "coefficients": cpu(got.coefficients), "readout": cpu(_readout(got))}

    def keep(self, seqs: list[Tokenized], arrays: Mapping[str, Any]) -> None:
        """Hold the reading `arrays` (`ReadCache.arrays` of what `read(seqs)` returned, e.g. kept in a results
        store and read back) for the sequences of `seqs` not held yet: a later `read` of them reads nothing."""
        rows: dict[_Key, int] = {}
        for i, k in enumerate(map(_key, seqs)):
            if k not in self._rows:
                rows.setdefault(k, i)
        if not rows:
            return
        pick = list(rows.values())
        move = lambda a: torch.as_tensor(np.asarray(a)[pick]).to(self.model.device)
        layers = {label: move(arrays["layers"][label]) for label in self.labels}
        self._add(list(rows), Reading(move(arrays["final"]), move(arrays["hidden"]), layers, move(arrays["values"]),
                                      move(arrays["coefficients"]), move(arrays["readout"])))

    def _add(self, keys: list[_Key], got: Reading) -> None:
        """Hold `got` (rows in the order of `keys`); the held readings are joined once, when next asked for."""
        base = len(self._rows)
        self._rows.update({k: base + i for i, k in enumerate(keys)})
        self._parts.append(got)

    def _joined(self) -> Reading | None:
        """Every held reading as one (row i: the sequence `_rows` maps to i), joined once per new read."""
        if len(self._parts) > 1:
            parts = self._parts

            def cat(pick: Callable[[Reading], torch.Tensor]) -> torch.Tensor:
                return torch.cat([pick(r) for r in parts])

            layers = {k: torch.cat([r.layers[k] for r in parts]) for k in parts[0].layers}
            self._parts = [Reading(cat(lambda r: r.final), cat(lambda r: r.hidden), layers, cat(lambda r: r.values),
                                   cat(lambda r: r.coefficients), cat(lambda r: _readout(r)))]
        return self._parts[0] if self._parts else None


def _readout(reading: Reading) -> torch.Tensor:
    assert reading.readout is not None  # every read of the cache asks for it
    return reading.readout
