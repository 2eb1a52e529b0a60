"""`calibrate`: grade every instrument on model organisms, where the right answer is planted.

The suite is the list `GRADERS`. A grader takes the shared `OrganismBench` (organisms built on demand,
loaded once, with held-out pairs) and returns `Grade` rows; an instrument joins the suite by
appending one grader. Each row states what was measured, the threshold and whether it passed,
so a scorecard reads as "this instrument finds what we planted, this well".
"""

from ._concepts import grade_concepts as grade_concepts
from ._conflict import grade_conflict as grade_conflict
from ._core import STRENGTHS as STRENGTHS
from ._core import Grade as Grade
from ._core import Grader as Grader
from ._core import OrganismBench as OrganismBench
from ._core import Scorecard as Scorecard
from ._core import localisation as localisation
from ._core import strength_response as strength_response
from ._editing import grade_editing as grade_editing
from ._graphs import grade_graphs as grade_graphs
from ._instruments import grade_attribution as grade_attribution
from ._instruments import grade_lens as grade_lens
from ._instruments import grade_organisms as grade_organisms
from ._instruments import grade_patching as grade_patching
from ._instruments import grade_sae as grade_sae
from ._kinds import KindBench as KindBench
from ._kinds import grade_dpo as grade_dpo
from ._kinds import grade_prm as grade_prm
from ._neurons import grade_neurons as grade_neurons
from ._probes import bank_items as bank_items
from ._probes import grade_distortion as grade_distortion
from ._probes import grade_probes as grade_probes
from ._suite import GRADERS as GRADERS
from ._suite import calibrate as calibrate

__all__ = [
    "OrganismBench",
    "GRADERS",
    "Grade",
    "Grader",
    "KindBench",
    "STRENGTHS",
    "Scorecard",
    "bank_items",
    "calibrate",
    "grade_attribution",
    "grade_concepts",
    "grade_conflict",
    "grade_distortion",
    "grade_dpo",
    "grade_editing",
    "grade_graphs",
    "grade_lens",
    "grade_neurons",
    "grade_organisms",
    "grade_patching",
    "grade_prm",
    "grade_probes",
    "grade_sae",
    "localisation",
    "strength_response",
]
