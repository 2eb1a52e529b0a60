"""`python -m rewardlens.realmodels` as before the house moved: the real models live in `rewardlens.zoo.realmodels`.

A face, not an implementation: it runs that module's command line and re-exports nothing else.
"""

from .zoo.realmodels import main as main

__all__ = ["main"]

if __name__ == "__main__":
    main()
