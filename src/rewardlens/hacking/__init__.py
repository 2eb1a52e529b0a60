"""Reward-hacking instruments: probes on built-in items, distortion, cascades, concepts, conflicts, editing.

The plumbing the audit builds on (the probes' chunk store, an edit's hidden states) is `hacking.internal`.
"""

from .._deprecated import moved as _moved
from ._axes import AXES as AXES
from ._axes import Axis as Axis
from ._axes import contrast_sets as contrast_sets
from ._cascade import MIN_ITEMS as MIN_ITEMS
from ._cascade import Cascades as Cascades
from ._cascade import cascade as cascade
from ._concept_files import read_concept_file as read_concept_file
from ._concepts import ALPHAS as ALPHAS
from ._concepts import Concepts as Concepts
from ._concepts import ConceptSets as ConceptSets
from ._concepts import concepts as concepts
from ._conflict import RELATIONS as RELATIONS
from ._conflict import Conflicts as Conflicts
from ._conflict import conflict as conflict
from ._distortion import Distortion as Distortion
from ._distortion import distortion as distortion
from ._edit_report import EditReport as EditReport
from ._edit_report import edit_report as edit_report
from ._editing import METHODS as METHODS
from ._editing import Edit as Edit
from ._editing import edit as edit
from ._editing import save_edit as save_edit
from ._fit import spread_items as spread_items
from ._items import DOMAINS as DOMAINS
from ._items import ITEMS as ITEMS
from ._items import Item as Item
from ._items import base_items as base_items
from ._items import items as items
from ._probes import Probes as Probes
from ._probes import probe as probe
from ._stages import STAGES as STAGES

# The plumbing moved to `rewardlens.hacking.internal` (0.2); the old names work for one release.
__getattr__ = _moved(__name__, dict.fromkeys(("Chunks", "final_hidden_states"), "rewardlens.hacking.internal"))

__all__ = [
    "spread_items",
    "ALPHAS",
    "AXES",
    "Axis",
    "Cascades",
    "ConceptSets",
    "Concepts",
    "Conflicts",
    "DOMAINS",
    "Distortion",
    "Edit",
    "EditReport",
    "ITEMS",
    "Item",
    "METHODS",
    "MIN_ITEMS",
    "Probes",
    "RELATIONS",
    "base_items",
    "cascade",
    "concepts",
    "conflict",
    "contrast_sets",
    "distortion",
    "edit",
    "edit_report",
    "items",
    "probe",
    "STAGES",
    "read_concept_file",
    "save_edit",
]
