"""This package's version (``notebook_accel.__version__``), in a module of its own so that the
engine reads it without importing the package's front door."""

__version__ = "0.1.0"
