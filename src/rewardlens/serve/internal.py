"""The server's plumbing: the thread that feeds the policy monitor one batch per step (`Roller`), what `/alarms`
answers (`alarm_state`), the longest sequence accepted (`sequence_limit`) and pad stripping of decoded text
(`strip_pad`). Users call `build_server`/`run_server` or `rewardlens serve` (`rewardlens.serve`), which use them.
"""

from ._app import alarm_state as alarm_state
from ._protocol import strip_pad as strip_pad
from ._roll import Roller as Roller
from ._run import sequence_limit as sequence_limit

__all__ = ["Roller", "alarm_state", "sequence_limit", "strip_pad"]
