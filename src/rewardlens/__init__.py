"""rewardlens: mechanistic interpretability of reward models, read along the reward head."""

from .attribution import Attribution as Attribution
from .attribution import attribute as attribute
from .attribution_patching import attribution_patch as attribution_patch
from .audit import Audit as Audit
from .audit import audit as audit
from .calibrate import Scorecard as Scorecard
from .calibrate import calibrate as calibrate
from .cascade import Cascades as Cascades
from .cascade import cascade as cascade
from .compare import Comparison as Comparison
from .compare import compare as compare
from .concepts import Concepts as Concepts
from .concepts import concepts as concepts
from .conflict import Conflicts as Conflicts
from .conflict import conflict as conflict
from .data import Pair as Pair
from .data import load_pairs as load_pairs
from .distortion import Distortion as Distortion
from .distortion import distortion as distortion
from .editing import Edit as Edit
from .editing import edit as edit
from .errors import RewardLensError as RewardLensError
from .faithfulness import Faithfulness as Faithfulness
from .faithfulness import faithfulness as faithfulness
from .lens import Lens as Lens
from .lens import lens as lens
from .loading import load as load
from .loading import wrap as wrap
from .model.arch import ArchitectureMap as ArchitectureMap
from .model.arch import register_architecture as register_architecture
from .model.core import RewardModel as RewardModel
from .monitor import Monitor as Monitor
from .monitor import Trajectory as Trajectory
from .patching import Patching as Patching
from .patching import patch as patch
from .probes import Probes as Probes
from .probes import probe as probe
from .sae import SAEConfig as SAEConfig
from .sae import TopKSAE as TopKSAE
from .sae import load_sae as load_sae
from .sae_attribution import attribute_features as attribute_features
from .sae_train import train_sae as train_sae
from .store import Store as Store

__all__ = [
    "ArchitectureMap", "Attribution", "Audit", "Cascades", "Comparison", "Concepts", "Conflicts", "Distortion", "Edit",
    "Faithfulness", "Lens", "Monitor", "Pair", "Patching", "Probes", "RewardLensError", "RewardModel", "SAEConfig",
    "Scorecard", "Store", "TopKSAE", "Trajectory", "attribute", "attribute_features", "attribution_patch", "audit",
    "calibrate", "cascade", "compare", "concepts", "conflict", "distortion", "edit", "faithfulness", "lens", "load",
    "load_pairs", "load_sae", "patch", "probe", "register_architecture", "train_sae", "wrap",
]
__version__ = "0.1.0"
