"""cproxy: ordered delivery per key without head-of-line blocking."""

from cproxy import _native

__version__ = "0.1.0"

# Before any hot-path module is imported: compiled, or from source if they changed (_native).
_native.install()
