"""`bench`: a reward model on RewardBench-schema pairs, scored the way RewardBench scores it.

Per-subset accuracy with Wilson intervals, RewardBench's four sections and prior sets with its
fixed `EXAMPLE_COUNTS` weighting (math-prm weighs as much as all code subsets; `weighting="items"`
weighs the items scored), the overall score, RewardBench 2's best-of-N accuracy (a tie at the top scores 1/k,
as rewardbench 0.1.4 scores it; `best_of_n_ties="argmax"` keeps the earlier rule) and its Ties score by its
own rule, and a paired bootstrap to compare two models on the same items. See docs/bench.md.
"""

from ._bench import bench as bench
from ._best_of_n import BEST_OF_N_TIES as BEST_OF_N_TIES
from ._items import NO_SUBSET as NO_SUBSET
from ._result import TIES_RULE as TIES_RULE
from ._result import Bench as Bench
from ._result import BenchComparison as BenchComparison
from ._result import SubsetScore as SubsetScore
from ._sections import CODE as CODE
from ._sections import EXAMPLE_COUNTS as EXAMPLE_COUNTS
from ._sections import PRIOR_SETS as PRIOR_SETS
from ._sections import RB2_SUBSETS as RB2_SUBSETS
from ._sections import SECTION_OF as SECTION_OF
from ._sections import SECTIONS as SECTIONS
from ._sections import WEIGHTINGS as WEIGHTINGS
from ._sections import section_weights as section_weights
from ._ties import TiesScore as TiesScore

__all__ = ["BEST_OF_N_TIES", "CODE", "EXAMPLE_COUNTS", "NO_SUBSET", "PRIOR_SETS", "RB2_SUBSETS", "SECTIONS",
           "SECTION_OF", "TIES_RULE", "WEIGHTINGS", "Bench", "BenchComparison", "SubsetScore", "TiesScore", "bench",
           "section_weights"]
