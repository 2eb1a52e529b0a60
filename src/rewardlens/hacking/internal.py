"""The hacking layer's plumbing for its sibling subpackages: where the probes keep their scored sequences chunk
by chunk (`Chunks`, the audit's store implements it) and the final hidden states an edit is checked on. Users
call `probe`, `concepts`, `edit` and the rest of `rewardlens.hacking`; the workflows import these from here.
"""

from ._editing import final_hidden_states as final_hidden_states
from ._scored import Chunks as Chunks

__all__ = ["Chunks", "final_hidden_states"]
