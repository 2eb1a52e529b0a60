"""Attribution graphs of a reward model (Ameisen et al. 2025, "Circuit Tracing"; the `circuit-tracer` library).

Each MLP is replaced by its transcoder (or kept as its own neurons, `basis="neurons"`), attention patterns
and norm scales are frozen at the input, and the graph holds the direct linear effect of every token
embedding, active feature and reconstruction error on every later feature and on the reward, closing on
the reward exactly. `graph(model, pairs, transcoders)` builds each side's graph and the pair's margin
graph; an `AttributionGraph` prunes (`prune`), scores (`scores`), ranks paths (`top_paths`), plots, and
saves in circuit-tracer's graph-file format (`save`). See docs/graphs.md.
"""

from ._contexts import feature_contexts as feature_contexts
from ._graph import AttributionGraph as AttributionGraph
from ._graph import Nodes as Nodes
from ._graph import Scores as Scores
from ._page import graph_page as graph_page
from ._page import node_feature as node_feature
from ._page import write_graph_page as write_graph_page
from ._pairs import BASES as BASES
from ._pairs import MAX_NODES as MAX_NODES
from ._pairs import PairGraph as PairGraph
from ._pairs import graph as graph

__all__ = ["AttributionGraph", "BASES", "MAX_NODES", "Nodes", "PairGraph", "Scores", "feature_contexts", "graph",
           "graph_page", "node_feature", "write_graph_page"]
