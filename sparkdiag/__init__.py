"""sparkdiag: GPU health and performance-regression daemon."""

__version__ = "0.1.0"
