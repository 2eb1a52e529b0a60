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
    from .audit import Store as Store
    from .audit import audit as audit
    from .bench import Bench as Bench
    from .bench import bench as bench
    from .calibrate import Scorecard as Scorecard
    from .calibrate import calibrate as calibrate
    from .causal import Circuit as Circuit
    from .causal import Edges as Edges
    from .causal import Faithfulness as Faithfulness
    from .causal import Patching as Patching
    from .causal import PatchSpec as PatchSpec
    from .causal import PathPatching as PathPatching
    from .causal import attribution_patch as attribution_patch
    from .causal import circuit as circuit
    from .causal import edges as edges
    from .causal import faithfulness as faithfulness
    from .causal import patch as patch
    from .causal import path_patch as path_patch
    from .compare import Comparison as Comparison
    from .compare import compare as compare
    from .data import Pair as Pair
    from .data import load_pairs as load_pairs
    from .errors import RewardLensError as RewardLensError
    from .exact import Attribution as Attribution
    from .exact import Lens as Lens
    from .exact import TokenAttribution as TokenAttribution
    from .exact import attribute as attribute
    from .exact import lens as lens
    from .exact import tokens as tokens
    from .hacking import Cascades as Cascades
    from .hacking import Concepts as Concepts
    from .hacking import Conflicts as Conflicts
    from .hacking import Distortion as Distortion
    from .hacking import Edit as Edit
    from .hacking import Probes as Probes
    from .hacking import cascade as cascade
    from .hacking import concepts as concepts
    from .hacking import conflict as conflict
    from .hacking import distortion as distortion
    from .hacking import edit as edit
    from .hacking import probe as probe
    from .loop import verify_edit as verify_edit
    from .model import ArchitectureMap as ArchitectureMap
    from .model import Reads as Reads
    from .model import RewardModel as RewardModel
    from .model import load as load
    from .model import load_dpo as load_dpo
    from .model import load_judge as load_judge
    from .model import load_prm as load_prm
    from .model import register_architecture as register_architecture
    from .model import wrap as wrap
    from .model import wrap_dpo as wrap_dpo
    from .model import wrap_judge as wrap_judge
    from .model import wrap_prm as wrap_prm
    from .monitor import Monitor as Monitor
    from .monitor import Trajectory as Trajectory
    from .monitor import monitored_reward as monitored_reward
    from .sae import FeaturePatch as FeaturePatch
    from .sae import FeatureReport as FeatureReport
    from .sae import FeatureSteer as FeatureSteer
    from .sae import SAEConfig as SAEConfig
    from .sae import TopKSAE as TopKSAE
    from .sae import attribute_features as attribute_features
    from .sae import feature_patch as feature_patch
    from .sae import feature_report as feature_report
    from .sae import feature_steer as feature_steer
    from .sae import load_sae as load_sae
    from .sae import train_sae as train_sae

__all__ = [
    "ArchitectureMap", "Attribution", "Audit", "Bench", "Cascades", "Circuit", "Comparison", "Concepts", "Conflicts",
    "Distortion", "Edges", "Edit", "Faithfulness", "FeaturePatch", "FeatureReport", "FeatureSteer",
    "Lens", "Monitor", "Pair", "PatchSpec", "PathPatching", "Patching", "Probes", "Reads",
    "RewardLensError",
    "RewardModel", "SAEConfig", "Scorecard", "Store", "TokenAttribution", "TopKSAE", "Trajectory", "attribute",
    "attribute_features", "attribution_patch", "audit", "bench", "calibrate", "cascade", "circuit", "compare",
    "concepts", "conflict", "distortion", "edges", "edit", "faithfulness", "feature_patch", "feature_report",
    "feature_steer", "lens", "load", "load_dpo", "load_judge", "load_pairs",
    "load_prm", "load_sae", "monitored_reward", "patch", "path_patch", "probe", "register_architecture", "tokens",
    "train_sae", "verify_edit",
    "wrap", "wrap_dpo", "wrap_judge", "wrap_prm",
]

# Each public name → the subpackage face that defines it (the imports above, for the type checker).
_FACE: dict[str, str] = {
    **dict.fromkeys(("Audit", "Store", "audit"), "audit"),
    **dict.fromkeys(("Bench", "bench"), "bench"),
    **dict.fromkeys(("Scorecard", "calibrate"), "calibrate"),
    **dict.fromkeys(("Circuit", "Edges", "circuit", "edges", "Faithfulness", "PatchSpec", "PathPatching", "Patching",
                     "attribution_patch", "faithfulness", "patch", "path_patch"), "causal"),
    **dict.fromkeys(("Comparison", "compare"), "compare"),
    **dict.fromkeys(("Pair", "load_pairs"), "data"),
    **dict.fromkeys(("RewardLensError",), "errors"),
    **dict.fromkeys(("Attribution", "Lens", "TokenAttribution", "attribute", "lens", "tokens"), "exact"),
    **dict.fromkeys(("Cascades", "Concepts", "Conflicts", "Distortion", "Edit", "Probes", "cascade", "concepts",
                     "conflict", "distortion", "edit", "probe"), "hacking"),
    **dict.fromkeys(("ArchitectureMap", "Reads", "RewardModel", "load", "load_dpo", "load_judge", "load_prm",
                     "register_architecture", "wrap", "wrap_dpo", "wrap_judge", "wrap_prm"), "model"),
    **dict.fromkeys(("verify_edit",), "loop"),
    **dict.fromkeys(("Monitor", "Trajectory", "monitored_reward"), "monitor"),
    **dict.fromkeys(("FeatureReport", "feature_report"), "sae"),
    **dict.fromkeys(("FeaturePatch", "FeatureSteer", "SAEConfig", "TopKSAE", "attribute_features", "feature_patch",
                     "feature_steer", "load_sae", "train_sae"), "sae"),
}


def __getattr__(name: str) -> _Any:
    face = _FACE.get(name)
    if face is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{face}", __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(_types.ModuleType):
    """Importing a subpackage binds it on its parent; `audit`, `bench`, `calibrate` and `compare` are also
    functions of this face, and the function must win (as it did when every name loaded eagerly)."""

    def __setattr__(self, name: str, value: _Any) -> None:
        if name in _FACE and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
