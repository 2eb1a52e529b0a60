"""Activations held in memory: the model runs once, and every epoch (and the evaluation after training)
rereads what it wrote.

An `ActivationSource` reruns the model on every pass, so `epochs` passes cost `epochs` forwards of
every input. Held in memory, its activations cost

    bytes = n_rows × d_in × 4        (fp32, as `Activations.x` is; `n_rows` tokens, `d_in` their width)

of CPU memory, known before the pass from the tokenized inputs. `hold_activations` holds them when
that is within a budget (`DEFAULT_MEMORY_GB` unless given; 0 never holds), and otherwise streams,
saying which in one line. A shard cache on disk (`cache_activations`) is the choice for sets over
the budget that are trained on again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import UsageError
from ._activations import Activations, ActivationSource

DEFAULT_MEMORY_GB = 2.0
"""The memory budget (GB, 1e9 bytes) within which `hold_activations` (and `sae train`) keeps the activations in
memory rather than rerunning the model each epoch: 2 GB is ~870k tokens of a 576-wide model (SmolLM2-135M)."""
BYTES_PER_VALUE = 4
"""Activations are held in fp32."""


def activation_bytes(source: ActivationSource) -> int:
    """The memory `source`'s activations take held: n_rows × d_in × 4 bytes (module docstring)."""
    return source.n_rows * source.d_in * BYTES_PER_VALUE


class MemoryActivations:
    """The activations of one pass of `source`, on the CPU, yielded again on every iteration (no model run).

    A training source as `ActivationSource` and `ShardedActivations` are (`d_in`, `n_rows`, `origin()`, chunks
    of `Activations`), so an SAE trained on it records the same provenance.
    """

    def __init__(self, source: ActivationSource) -> None:
        self.d_in, self.n_rows, self.point, self.positions = source.d_in, source.n_rows, source.point, source.positions
        self._origin = source.origin()
        self.chunks = [Activations(c.x.detach().cpu(), c.seq.cpu(), c.pos.cpu()) for c in source]

    def origin(self) -> dict[str, Any]:
        """`ActivationSource.origin` of the source held (point, positions, model name and fingerprint)."""
        return dict(self._origin)

    def __iter__(self) -> Iterator[Activations]:
        yield from self.chunks


def hold_activations(source: ActivationSource,
                     budget_gb: float = DEFAULT_MEMORY_GB) -> tuple[ActivationSource | MemoryActivations, str]:
    """(`MemoryActivations` of `source` when its activations fit `budget_gb`, else `source` itself; one line
    saying which and why). `budget_gb` 0 never holds them (every pass reruns the model)."""
    if not budget_gb >= 0:
        raise UsageError(f"budget_gb is a memory budget in GB (>= 0; 0 never holds), got {budget_gb}")
    size = activation_bytes(source)
    what = (f"{source.n_rows} activations × {source.d_in} × {BYTES_PER_VALUE} bytes = {size / 1e9:.3g} GB")
    if budget_gb > 0 and size <= budget_gb * 1e9:
        return MemoryActivations(source), (f"activations held in memory ({what}, within the {budget_gb:g} GB "
                                           "budget): the model runs once, not once per epoch")
    why = "holding is off" if budget_gb == 0 else f"over the {budget_gb:g} GB budget"
    return source, f"activations streamed ({what}, {why}): the model reruns on every epoch"
