"""rewardlens: mechanistic interpretability of reward models, read along the reward head."""

from ._version import __version__ as __version__
from .audit import Audit as Audit
from .audit import Store as Store
from .audit import audit as audit
from .calibrate import Scorecard as Scorecard
from .calibrate import calibrate as calibrate
from .causal import Faithfulness as Faithfulness
from .causal import Patching as Patching
from .causal import attribution_patch as attribution_patch
from .causal import faithfulness as faithfulness
from .causal import patch as patch
from .compare import Comparison as Comparison
from .compare import compare as compare
from .data import Pair as Pair
from .data import load_pairs as load_pairs
from .errors import RewardLensError as RewardLensError
from .exact import Attribution as Attribution
from .exact import Lens as Lens
from .exact import attribute as attribute
from .exact import lens as lens
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
from .model import ArchitectureMap as ArchitectureMap
from .model import RewardModel as RewardModel
from .model import load as load
from .model import register_architecture as register_architecture
from .model import wrap as wrap
from .monitor import Monitor as Monitor
from .monitor import Trajectory as Trajectory
from .sae import SAEConfig as SAEConfig
from .sae import TopKSAE as TopKSAE
from .sae import attribute_features as attribute_features
from .sae import load_sae as load_sae
from .sae import train_sae as train_sae

__all__ = [
    "ArchitectureMap", "Attribution", "Audit", "Cascades", "Comparison", "Concepts", "Conflicts", "Distortion", "Edit",
    "Faithfulness", "Lens", "Monitor", "Pair", "Patching", "Probes", "RewardLensError", "RewardModel", "SAEConfig",
    "Scorecard", "Store", "TopKSAE", "Trajectory", "attribute", "attribute_features", "attribution_patch", "audit",
    "calibrate", "cascade", "compare", "concepts", "conflict", "distortion", "edit", "faithfulness", "lens", "load",
    "load_pairs", "load_sae", "patch", "probe", "register_architecture", "train_sae", "wrap",
]
