"""`GraphLike`: what the graph's helper modules (`_plot`, `_files`, `_paths`, `_interventions`) read of an
`AttributionGraph`. Named structurally because `_graph` calls those modules: annotating with the class itself
would tie them in an import cycle (as `model/_backbone.py` names `RewardModel` for the modules below it).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class GraphLike(Protocol):
    """The read-only face of an attribution graph its plot, files and interventions use (graphs/_graph.py)."""

    @property
    def nodes(self) -> Any: ...  # graphs._graph.Nodes

    @property
    def adjacency(self) -> np.ndarray: ...

    @property
    def rows(self) -> np.ndarray: ...

    @property
    def tokens(self) -> list[str]: ...

    @property
    def label(self) -> str: ...

    @property
    def basis(self) -> str: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def read_at(self) -> int: ...

    @property
    def dropped(self) -> int: ...

    @property
    def meta(self) -> dict[str, Any]: ...

    @property
    def reward(self) -> float: ...

    @property
    def root(self) -> int: ...

    @property
    def influence(self) -> np.ndarray: ...

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> GraphLike: ...
