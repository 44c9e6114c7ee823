"""The version of mmdata, in one place: the package, the CLI and the stores it writes name it."""

__version__ = "0.1.0"
