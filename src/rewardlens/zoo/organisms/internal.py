"""The organism cache's plumbing: the file lock that lets one process build an organism while the others wait.
Users call `build` (`rewardlens.zoo.organisms`); tools that fill the cache by hand import these from here.
"""

from ._cache import locked as locked

__all__ = ["locked"]
