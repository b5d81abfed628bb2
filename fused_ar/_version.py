"""The package version: one definition, read by pyproject (dynamic) and by the cache key."""

__version__ = "0.1.0"
