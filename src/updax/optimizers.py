"""Ready-made optimizers, each one readable expression over :mod:`updax.updates`.

Filled by the optimizers issue (Axon's set and the modern set).
"""

__all__: list[str] = []
