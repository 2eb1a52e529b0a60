"""The installed distribution's version, read from its metadata so no module imports the package face."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rewardlens")
except PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"
