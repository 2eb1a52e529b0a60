"""rewardlens: mechanistic interpretability of reward models, read along the reward head.

The names below load on first use (PEP 562): `import rewardlens` and the command line's argument
checks import neither torch nor transformers; `rl.load`, `from rewardlens import patch`, ... import
the subpackage that defines the name the first time it is asked for.
"""

import importlib as _importlib
import sys as _sys
import types as _types
from typing import TYPE_CHECKING
from typing import Any as _Any

from ._version import __version__ as __version__

if TYPE_CHECKING:
    from .audit import Audit as Audit
    from .audit import audit as audit
    from .causal import Circuit as Circuit
    from .causal import Patching as Patching
    from .causal import PatchSpec as PatchSpec
    from .causal import circuit as circuit
    from .causal import edges as edges
    from .causal import faithfulness as faithfulness
    from .causal import patch as patch
    from .causal import path_patch as path_patch
    from .data import Pair as Pair
    from .data import load_pairs as load_pairs
    from .errors import RewardLensError as RewardLensError
    from .exact import Attribution as Attribution
    from .exact import Lens as Lens
    from .exact import attribute as attribute
    from .exact import lens as lens
    from .exact import tokens as tokens
    from .graphs import graph as graph
    from .hacking import concepts as concepts
    from .hacking import edit as edit
    from .hacking import probe as probe
    from .model import RewardModel as RewardModel
    from .model import load as load
    from .model import wrap as wrap
    from .sae import attribute_features as attribute_features
    from .sae import feature_patch as feature_patch

# The mental model, and nothing else (docs/design.md "Words"): load or wrap a reward model, read pairs,
# run an instrument `rl.X(model, pairs, **options)` → a frozen result in reward units, or the whole audit.
# `graph`: attribution graphs over transcoders (rewardlens.graphs).
__all__ = [
    "Attribution", "Audit", "Circuit", "Lens", "Pair", "PatchSpec", "Patching", "RewardLensError", "RewardModel",
    "attribute", "attribute_features", "audit", "circuit", "concepts", "edges", "edit", "faithfulness",
    "feature_patch", "graph", "lens", "load", "load_pairs", "patch", "path_patch", "probe", "tokens", "wrap",
]

# Each public name → the subpackage face that defines it (the imports above, for the type checker).
_FACE: dict[str, str] = {
    **dict.fromkeys(("Audit", "audit"), "audit"),
    **dict.fromkeys(("Circuit", "PatchSpec", "Patching", "circuit", "edges", "faithfulness", "patch", "path_patch"),
                    "causal"),
    **dict.fromkeys(("Pair", "load_pairs"), "data"),
    **dict.fromkeys(("RewardLensError",), "errors"),
    **dict.fromkeys(("Attribution", "Lens", "attribute", "lens", "tokens"), "exact"),
    **dict.fromkeys(("concepts", "edit", "probe"), "hacking"),
    **dict.fromkeys(("RewardModel", "load", "wrap"), "model"),
    **dict.fromkeys(("attribute_features", "feature_patch"), "sae"),
    **dict.fromkeys(("graph",), "graphs"),
}

# Names the face held until 0.1: each still resolves, with a DeprecationWarning naming its home (one release).
_MOVED: dict[str, str] = {
    **{name: f"rewardlens.audit:{name}" for name in ("Store",)},
    **{name: f"rewardlens.bench:{name}" for name in ("Bench", "bench")},
    **{name: f"rewardlens.calibrate:{name}" for name in ("Scorecard", "calibrate")},
    **{name: f"rewardlens.causal:{name}" for name in ("Edges", "Faithfulness", "PathPatching", "attribution_patch")},
    **{name: f"rewardlens.compare:{name}" for name in ("Comparison", "compare")},
    **{name: f"rewardlens.exact:{name}" for name in ("TokenAttribution",)},
    **{name: f"rewardlens.hacking:{name}" for name in ("Cascades", "Concepts", "Conflicts", "Distortion", "Edit",
                                                        "Probes", "cascade", "conflict", "distortion")},
    **{name: f"rewardlens.loop:{name}" for name in ("verify_edit",)},
    **{name: f"rewardlens.model:{name}" for name in ("ArchitectureMap", "Reads", "load_dpo", "load_judge", "load_prm",
                                                      "register_architecture", "wrap_dpo", "wrap_judge", "wrap_prm")},
    **{name: f"rewardlens.monitor:{name}" for name in ("Monitor", "Trajectory", "monitored_reward")},
    **{name: f"rewardlens.sae:{name}" for name in ("FeaturePatch", "FeatureReport", "FeatureSteer", "SAEConfig",
                                                    "TopKSAE", "feature_report", "feature_steer", "load_sae",
                                                    "train_sae")},
}


# Subpackages a user reaches as `rl.model.load_prm`, `rl.hacking.cascade`: imported on first use. (`audit`,
# `bench`, `calibrate` and `compare` name functions here; reach those subpackages with `import rewardlens.audit`.)
_SUBPACKAGES = frozenset(("causal", "data", "exact", "graphs", "hacking", "loop", "model", "monitor", "plotting", "sae",
                          "zoo"))


def __getattr__(name: str) -> _Any:
    if name in _SUBPACKAGES:
        return _importlib.import_module(f".{name}", __name__)
    face = _FACE.get(name)
    if face is None:
        if name in _MOVED:  # not cached in globals(): every use of an old name warns
            from ._deprecated import resolve, warn

            warn(f"rewardlens.{name}", _MOVED[name])
            return resolve(_MOVED[name])
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{face}", __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(_types.ModuleType):
    """Importing a subpackage binds it on its parent; `audit` (and, deprecated, `bench`, `calibrate` and
    `compare`) are also functions of this face, and the function must win (as it did when every name loaded
    eagerly). Renaming the subpackages would end this, but the old import paths must keep working a release."""

    def __setattr__(self, name: str, value: _Any) -> None:
        if (name in _FACE or name in _MOVED) and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
