"""Ready-made optimizers, each one readable expression over :mod:`updax.updates`.

Learning rate first (a number or a schedule), Axon 0.3's defaults, and the
other options under Axon's names. ``print(ux.optimizers.lamb(1e-2))`` shows
the pipeline.
"""

from updax._modern_optimizers import (
    adadelta,
    adafactor,
    adamax,
    adamaxw,
    adan,
    amsgrad,
    fromage,
    lars,
    lion,
    muon,
    nadam,
    nadamw,
    novograd,
    rprop,
    schedule_free_adamw,
    sign_sgd,
    signum,
    sm3,
)
from updax._optimizers import adabelief, adagrad, adam, adamw, lamb, noisy_sgd, radam, rmsprop, sgd, yogi

__all__ = [
    # Axon's set
    "adabelief", "adagrad", "adam", "adamw", "lamb", "noisy_sgd", "radam", "rmsprop", "sgd", "yogi",
    # what users reach for today
    "adadelta", "adafactor", "adamax", "adamaxw", "adan", "amsgrad", "fromage", "lars", "lion", "muon", "nadam",
    "nadamw", "novograd",
    "rprop", "schedule_free_adamw", "sign_sgd", "signum", "sm3",
]
