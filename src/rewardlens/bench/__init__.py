"""`bench`: a reward model on RewardBench-schema pairs, scored the way RewardBench scores it.

Per-subset accuracy with Wilson intervals, RewardBench's four sections with its count weighting
(math-prm weighs as much as all code subsets), the overall score, RewardBench 2's best-of-N
accuracy, and a paired bootstrap to compare two models on the same items. See docs/bench.md.
"""

from ._bench import bench as bench
from ._result import TIES_RULE as TIES_RULE
from ._result import Bench as Bench
from ._result import BenchComparison as BenchComparison
from ._result import SubsetScore as SubsetScore
from ._sections import CODE as CODE
from ._sections import RB2_SUBSETS as RB2_SUBSETS
from ._sections import SECTION_OF as SECTION_OF
from ._sections import SECTIONS as SECTIONS
from ._sections import section_weights as section_weights

__all__ = ["CODE", "RB2_SUBSETS", "SECTIONS", "SECTION_OF", "TIES_RULE", "Bench", "BenchComparison", "SubsetScore",
           "bench", "section_weights"]
