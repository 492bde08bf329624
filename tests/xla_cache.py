"""JAX's persistent compilation cache shared by the processes of one test run, its entries written atomically.

JAX writes a cache entry in place (``LRUCache.put`` without eviction), so a process reading the directory while
another writes could load half an executable. :func:`write_atomically` makes every entry appear whole: written to
a file of its own, then renamed over its name (``os.replace``, atomic within a directory). Every process that
shares a directory must call it before it compiles: tests/conftest.py does for the test processes, and
tests/checkpoint_cases.py for the process that resumes the checkpoints. Importing this module does nothing.
"""

from __future__ import annotations

import os
import tempfile


def write_atomically() -> bool:
    """Makes this process's cache entries appear whole; False where this JAX keeps its cache otherwise (the
    directory should then not be shared)."""
    try:
        from jax._src import lru_cache
        suffix, original = lru_cache._CACHE_SUFFIX, lru_cache.LRUCache.put
    except (ImportError, AttributeError):
        return False
    if getattr(original, "atomic", False):
        return True

    def put(self, key: str, value: bytes) -> None:
        if self.eviction_enabled:  # (JAX then writes under a file lock of its own)
            return original(self, key, value)
        path = os.path.join(str(self.path), f"{key}{suffix}")
        if os.path.exists(path):
            return
        fd, partial = tempfile.mkstemp(dir=str(self.path), prefix=".partial-")
        with os.fdopen(fd, "wb") as out:
            out.write(value)
        os.replace(partial, path)

    put.atomic = True
    lru_cache.LRUCache.put = put
    return True
