"""The package's version: the one place it is written (pyproject.toml reads it from here).

A literal, not `importlib.metadata.version`: reading the installed metadata cost about 20 ms of
the 40 ms `import rewardlens` takes, and every CLI error pays for the import. No module imports
the package face for it.
"""

__version__ = "0.2.0"
