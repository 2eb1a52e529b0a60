"""TopK sparse autoencoders on the residual stream: the autoencoder, activations, training, feature attribution,
feature interventions and steering; transcoders. The plumbing its siblings build on (hook-point folder names,
the MLP modules transcoders hook, the transcoder check, the memory budget for held activations) is
`rewardlens.sae.internal`.
"""

from .._deprecated import moved as _moved
from ._activations import Activations as Activations
from ._activations import ActivationSource as ActivationSource
from ._activations import cache_activations as cache_activations
from ._activations import load_sae_for as load_sae_for
from ._attribution import FeatureAttribution as FeatureAttribution
from ._attribution import attribute_features as attribute_features
from ._autoencoder import SAEConfig as SAEConfig
from ._autoencoder import SAEOutput as SAEOutput
from ._autoencoder import TopKSAE as TopKSAE
from ._autoencoder import load_sae as load_sae
from ._cards import Context as Context
from ._cards import FeatureCard as FeatureCard
from ._cards import FeatureCards as FeatureCards
from ._cards import text_axes as text_axes
from ._fidelity import MIN_EXPLAINED_VARIANCE as MIN_EXPLAINED_VARIANCE
from ._fidelity import MIN_REWARD_RECOVERED as MIN_REWARD_RECOVERED
from ._fidelity import Fidelity as Fidelity
from ._fidelity import fidelity as fidelity
from ._memory import hold_activations as hold_activations
from ._page import feature_page as feature_page
from ._page import write_feature_page as write_feature_page
from ._patch import FeaturePatch as FeaturePatch
from ._patch import feature_patch as feature_patch
from ._provenance import Provenance as Provenance
from ._report import FeatureReport as FeatureReport
from ._report import feature_report as feature_report
from ._steer import FeatureSteer as FeatureSteer
from ._steer import feature_steer as feature_steer
from ._total import FeatureTotals as FeatureTotals
from ._total import feature_totals as feature_totals
from ._train import Source as Source
from ._train import TrainConfig as TrainConfig
from ._train import TrainResult as TrainResult
from ._train import evaluate as evaluate
from ._train import train_sae as train_sae
from ._transcoder import Transcoder as Transcoder
from ._transcoder import TranscoderConfig as TranscoderConfig
from ._transcoder import TranscoderProvenance as TranscoderProvenance
from ._transcoder import Transcoders as Transcoders
from ._transcoder_fit import TranscoderFidelity as TranscoderFidelity
from ._transcoder_fit import transcoder_fidelity as transcoder_fidelity
from ._transcoder_load import load_transcoders as load_transcoders
from ._transcoder_train import TranscoderTrainConfig as TranscoderTrainConfig
from ._transcoder_train import TranscoderTraining as TranscoderTraining
from ._transcoder_train import train_transcoders as train_transcoders

# Plumbing moved to `rewardlens.sae.internal` (0.2, issue 43 item 3); the old names work for one release.
__getattr__ = _moved(__name__, dict.fromkeys(
    ("DEFAULT_MEMORY_GB", "MemoryActivations", "activation_bytes", "attribute_with_readout", "check_transcoders",
     "hookpoint", "mlp_module", "mlp_modules"), "rewardlens.sae.internal"))

__all__ = [
    "ActivationSource",
    "Activations",
    "Context",
    "FeatureCard",
    "FeatureCards",
    "FeatureAttribution",
    "FeaturePatch",
    "FeatureReport",
    "Fidelity",
    "MIN_EXPLAINED_VARIANCE",
    "MIN_REWARD_RECOVERED",
    "Provenance",
    "FeatureSteer",
    "FeatureTotals",
    "SAEConfig",
    "SAEOutput",
    "Source",
    "TopKSAE",
    "Transcoder",
    "TranscoderConfig",
    "TranscoderFidelity",
    "TranscoderProvenance",
    "TranscoderTrainConfig",
    "TranscoderTraining",
    "Transcoders",
    "TrainConfig",
    "TrainResult",
    "attribute_features",
    "cache_activations",
    "evaluate",
    "feature_page",
    "feature_patch",
    "feature_report",
    "fidelity",
    "feature_steer",
    "feature_totals",
    "hold_activations",
    "load_sae",
    "load_sae_for",
    "load_transcoders",
    "text_axes",
    "train_sae",
    "train_transcoders",
    "transcoder_fidelity",
    "write_feature_page",
]
