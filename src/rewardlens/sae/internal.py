"""The sae layer's face for its sibling subpackages: the plumbing graphs, the audit, the calibration and the
command line build on (a hook point's SAE folder name, the MLP modules transcoders hook, the tokens they leave
out at each sequence's start, the check that a set of transcoders fits a model, attribution with its effective
read-out, the memory budget for holding activations). Users import `rewardlens.sae`; the others import these
names from here (`from ..sae.internal import ...`), as `rewardlens.model.internal`.
"""

from ._activations import hookpoint as hookpoint
from ._activations import skip_first_for as skip_first_for
from ._attribution import attribute_with_readout as attribute_with_readout
from ._memory import DEFAULT_MEMORY_GB as DEFAULT_MEMORY_GB
from ._memory import MemoryActivations as MemoryActivations
from ._memory import activation_bytes as activation_bytes
from ._transcoder_load import check_transcoders as check_transcoders
from ._transcoder_train import mlp_module as mlp_module
from ._transcoder_train import mlp_modules as mlp_modules

__all__ = [
    "DEFAULT_MEMORY_GB",
    "MemoryActivations",
    "activation_bytes",
    "attribute_with_readout",
    "check_transcoders",
    "hookpoint",
    "mlp_module",
    "mlp_modules",
    "skip_first_for",
]
