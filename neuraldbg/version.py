"""The package version, in a module of its own.

Any module can read it without importing the package (``neuraldbg/__init__`` imports
nearly everything).
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
