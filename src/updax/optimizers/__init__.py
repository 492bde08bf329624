"""Ready-made optimizers, each one readable expression over :mod:`updax.updates`.

Learning rate first (a number or a schedule), then the other options under
Axon's names where Axon has the optimizer (its defaults too), else the
paper's or optax's; decoupled weight decay is ``decay`` everywhere, as in
Axon's ``adamw``. ``print(ux.optimizers.lamb(1e-2))`` shows the pipeline.
"""

from updax.optimizers._adam import (
    adabelief,
    adam,
    adamax,
    adamaxw,
    adamw,
    adan,
    amsgrad,
    nadam,
    nadamw,
    radam,
    schedule_free_adamw,
    yogi,
)
from updax.optimizers._adam_variants import acprop, ademamix, adopt, laprop, simplified_ademamix
from updax.optimizers._dual_averaging import madgrad
from updax.optimizers._factored import adafactor, sm3
from updax.optimizers._galore import galore
from updax.optimizers._layerwise import fromage, lamb, lars, novograd
from updax.optimizers._lbfgs import lbfgs
from updax.optimizers._lr_free import cocob, dadapt_adamw, dog, dowg, momo, momo_adam, polyak_sgd, prodigy
from updax.optimizers._mars import mars_adamw, mars_lion
from updax.optimizers._optimistic import optimistic_adam, optimistic_adam_v2, optimistic_gradient_descent
from updax.optimizers._orthogonal import muon, normuon
from updax.optimizers._privacy import dpsgd
from updax.optimizers._psgd import psgd_kron
from updax.optimizers._rms import adadelta, adagrad, rmsprop
from updax.optimizers._shampoo import shampoo
from updax.optimizers._sgd import noisy_sgd, schedule_free_sgd, sgd
from updax.optimizers._sign import lion, rprop, sign_sgd, signum
from updax.optimizers._soap import soap
from updax.optimizers._sophia import sophia

__all__ = [
    # Axon's set
    "adabelief", "adagrad", "adam", "adamw", "lamb", "noisy_sgd", "radam", "rmsprop", "sgd", "yogi",
    # what users reach for today
    "adadelta", "adafactor", "adamax", "adamaxw", "adan", "amsgrad", "fromage", "lars", "lion", "muon", "nadam",
    "normuon",
    "lbfgs",
    "nadamw", "novograd", "optimistic_adam", "optimistic_gradient_descent",
    "ademamix", "adopt", "simplified_ademamix",
    "soap",
    "galore",
    "mars_adamw", "mars_lion",
    "cocob", "dadapt_adamw", "dog", "dowg", "polyak_sgd", "prodigy",
    "dpsgd",
    "rprop", "schedule_free_adamw", "sign_sgd", "signum", "sm3",
    "shampoo",
    "psgd_kron",
    "sophia",
    "madgrad",
    "laprop", "acprop",
    "schedule_free_sgd", "optimistic_adam_v2",
    "momo", "momo_adam",
]
