"""cproxy: ordered delivery per key without head-of-line blocking."""

__version__ = "0.1.0"
