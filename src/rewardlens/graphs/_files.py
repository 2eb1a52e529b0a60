"""An attribution graph in circuit-tracer's graph-file format, so its local frontend opens a reward model's graph.

The schema is circuit-tracer's (`frontend/graph_models.py`, `utils/create_graph_files.py`): one
`<slug>.json` holding `metadata` (slug, scan, transcoder_list, prompt_tokens, prompt, node_threshold,
schema_version), `qParams` (pinnedIds, supernodes, linkType, clickedId, sg_pos), `nodes` and `links`
(source, target, weight); and `graph-metadata.json`, the index of every graph in the folder
(`{"graphs": [metadata, ...]}`), which the frontend lists. Node ids follow its conventions: a feature
`"{layer}_{feature}_{pos}"`, an error `"{layer}_-1_{pos}"`, a token `"E_{token_id}_{pos}"`, and the reward
as its one logit node at layer `n_layers + 1`. `clerp` (the frontend's label) carries the rewardlens
Part name. A margin graph's positions run over the chosen side's tokens, then the rejected side's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ._shape import GraphLike

SCHEMA_VERSION = 1
INDEX = "graph-metadata.json"
_TYPES = ("cross layer transcoder", "mlp reconstruction error", "embedding", "logit")


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def _ctx(g: GraphLike, i: int) -> int:
    pos = int(g.nodes.position[i])
    rejected = g.nodes.side is not None and g.nodes.side[i] == "rejected"
    return pos + int(g.meta.get("rejected_offset", 0)) if rejected else pos


def _node(g: GraphLike, i: int, influence: float) -> dict[str, Any]:
    n, kind = g.nodes, int(g.nodes.kind[i])
    layer, feature, pos = int(n.layer[i]), int(n.feature[i]), _ctx(g, i)
    activation = None if np.isnan(n.activation[i]) else float(n.activation[i])
    base = {"ctx_idx": pos, "feature_type": _TYPES[kind], "token_prob": 0.0, "is_target_logit": False,
            "run_idx": 0, "reverse_ctx_idx": 0, "clerp": n.names[i], "influence": influence,
            "activation": activation}
    if kind == 0:
        return {**base, "node_id": f"{layer}_{feature}_{pos}", "feature": _cantor(layer, feature),
                "layer": str(layer), "jsNodeId": f"{layer}_{feature}-0"}
    if kind == 1:
        return {**base, "node_id": f"{layer}_-1_{pos}", "feature": -1, "layer": str(layer),
                "jsNodeId": f"{layer}_-1-{pos}"}
    if kind == 2:
        return {**base, "node_id": f"E_{feature}_{pos}", "feature": pos, "layer": "E", "jsNodeId": f"E_{feature}-{pos}"}
    top = str(g.n_layers + 1)
    return {**base, "node_id": f"{top}_0_{pos}", "feature": 0, "layer": top, "token_prob": 1.0,
            "is_target_logit": True, "jsNodeId": f"L_0-{pos}",
            "clerp": f"{n.names[i]} = {float(n.value[i]):.4g} (read at token {pos})"}


def graph_json(g: GraphLike, slug: str | None = None, node_threshold: float | None = None) -> dict[str, Any]:
    """The graph as circuit-tracer's graph file (module docstring); `influence` is each node's cumulative share
    of the influence, as circuit-tracer's `prune_graph` reports it."""
    share = g.meta.get("cumulative_influence")
    if share is None:
        infl = g.influence
        order = np.argsort(-infl, kind="stable")
        share_arr = np.zeros(len(infl))
        share_arr[order] = np.cumsum(infl[order]) / max(float(infl.sum()), 1e-30)
        share = share_arr.tolist()
    nodes = [_node(g, i, float(share[i])) for i in range(len(g.nodes.names))]
    r, s = g.adjacency.nonzero()
    links = [{"source": nodes[int(j)]["node_id"], "target": nodes[int(g.rows[i])]["node_id"],
              "weight": float(g.adjacency[i, j])} for i, j in zip(r, s)]
    slug = slug or _slug(g.label)
    meta = {"slug": slug, "scan": f"rewardlens-{g.basis}", "transcoder_list": [], "prompt_tokens": list(g.tokens),
            "prompt": "".join(g.tokens), "node_threshold": node_threshold, "schema_version": SCHEMA_VERSION,
            "info": {"label": g.label, "basis": g.basis, "reward": g.reward, "read_at": g.read_at,
                     "dropped": g.dropped}}
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": meta, "qParams": qparams, "nodes": nodes, "links": links}


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", label).strip("-") or "graph"


def save_graph(g: GraphLike, folder: Path, slug: str | None, node_threshold: float = 0.8,
               edge_threshold: float = 0.98) -> Path:
    """Write `<slug>.json` (pruned as circuit-tracer's `create_graph_files` prunes, unless already pruned) and
    add its metadata to the folder's `graph-metadata.json` (replacing a graph of the same slug)."""
    folder.mkdir(parents=True, exist_ok=True)
    pruned = g if "pruned" in g.meta else g.prune(node_threshold, edge_threshold)
    threshold = pruned.meta["pruned"]["node_threshold"]
    data = graph_json(pruned, slug, threshold)
    slug = data["metadata"]["slug"]
    path = folder / f"{slug}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    index_path = folder / INDEX
    index = json.loads(index_path.read_text(encoding="utf-8")) if index_path.exists() else {"graphs": []}
    index["graphs"] = [m for m in index.get("graphs", []) if m.get("slug") != slug] + [data["metadata"]]
    index_path.write_text(json.dumps(index, indent=2), encoding="utf-8")
    return path
