"""The organism cache's plumbing: where an organism's folder lives (`organism_dir`, `ORGANISM_VERSION`), the
`READY` marker written last, the build-once step (`built_once`) and the file lock that lets one process build
an organism while the others wait. Users call `build` (`rewardlens.zoo.organisms`); tools that fill or read the
cache by hand import these from here.
"""

from ._cache import ORGANISM_VERSION as ORGANISM_VERSION
from ._cache import READY as READY
from ._cache import built_once as built_once
from ._cache import locked as locked
from ._cache import organism_dir as organism_dir

__all__ = ["ORGANISM_VERSION", "READY", "built_once", "locked", "organism_dir"]
