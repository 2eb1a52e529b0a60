"""The closed loop: edit a planted bias out of a reward model, retrain a tiny policy against both,
and measure what the policy acquires and how early the alarms warn.

```python
from rewardlens.loop import verify_edit, loop_report
res = verify_edit(("keyword", "list"), seeds=(0, 1, 2))   # cached: start policies, edits, GRPO runs
res.summary()        # final behaviour rate original vs edited, gap with its interval over seeds
res.warnings()       # lead time and false alarms per 100 steps: the monitor and black-box signals
loop_report(res, "closed-loop.html")
```
See docs/closed-loop.md.
"""

from .._deprecated import moved as _moved
from ._organisms import bias_pairs as bias_pairs
from ._organisms import match as concept_match
from ._page import loop_report as loop_report
from ._signals import SIGNALS as SIGNALS
from ._signals import RunSeries as RunSeries
from ._signals import black_box as black_box
from ._signals import run_series as run_series
from ._train import PolicyRecipe as PolicyRecipe
from ._train import check_tokenizer as check_tokenizer
from ._train import sequence_logprobs as sequence_logprobs
from ._verify import ClosedLoop as ClosedLoop
from ._verify import OrganismLoop as OrganismLoop
from ._verify import gap_note as gap_note
from ._verify import run_notes as run_notes
from ._verify import verify_edit as verify_edit

# Renamed in 0.2 (docs/design.md "Words": a trace is a forward's activations, a recipe says what it trains);
# the old names work for one release.
__getattr__ = _moved(__name__, {"Trace": "rewardlens.loop:RunSeries", "trace": "rewardlens.loop:run_series",
                                "Recipe": "rewardlens.loop:PolicyRecipe"})

__all__ = ["SIGNALS", "ClosedLoop", "OrganismLoop", "PolicyRecipe", "RunSeries", "bias_pairs", "black_box",
           "check_tokenizer", "concept_match", "gap_note", "loop_report", "run_notes", "run_series",
           "sequence_logprobs", "verify_edit"]
