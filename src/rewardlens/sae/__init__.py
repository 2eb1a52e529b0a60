"""TopK sparse autoencoders on the residual stream: the autoencoder, activations, training, feature attribution.
"""

from ._activations import Activations as Activations
from ._activations import ActivationSource as ActivationSource
from ._activations import cache_activations as cache_activations
from ._activations import hookpoint as hookpoint
from ._activations import load_sae_for as load_sae_for
from ._attribution import FeatureAttribution as FeatureAttribution
from ._attribution import attribute_features as attribute_features
from ._autoencoder import SAEConfig as SAEConfig
from ._autoencoder import SAEOutput as SAEOutput
from ._autoencoder import TopKSAE as TopKSAE
from ._autoencoder import load_sae as load_sae
from ._report import FeatureReport as FeatureReport
from ._report import feature_report as feature_report
from ._train import Source as Source
from ._train import TrainConfig as TrainConfig
from ._train import TrainResult as TrainResult
from ._train import evaluate as evaluate
from ._train import train_sae as train_sae

__all__ = [
    "ActivationSource",
    "Activations",
    "FeatureAttribution",
    "FeatureReport",
    "SAEConfig",
    "SAEOutput",
    "Source",
    "TopKSAE",
    "TrainConfig",
    "TrainResult",
    "attribute_features",
    "cache_activations",
    "evaluate",
    "feature_report",
    "hookpoint",
    "load_sae",
    "load_sae_for",
    "train_sae",
]
