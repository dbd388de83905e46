"""Disque, a distributed in-memory job queue, as a Python node and client."""

__version__ = "1.0.0"

__all__ = ["__version__"]
