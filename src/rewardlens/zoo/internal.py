"""The zoo's plumbing: where built artifacts (organisms, policies, real models' folders) are cached,
`cache_dir()` ($REWARDLENS_CACHE, else ~/.cache/rewardlens). Users call `rewardlens.zoo.organisms.build` or
`demo_model_dir`, which use it; tools that read the cache by hand import it from here.
"""

from ._builtin import cache_dir as cache_dir

__all__ = ["cache_dir"]
