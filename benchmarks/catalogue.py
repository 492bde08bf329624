"""The catalogue side by side: every optimizer of ``updax.optimizers`` beside optax's with the same rule.

``compile_times.py --catalogue`` compiles each pair in rounds on the
transformer-like workload T (``run.py``'s ten recipes are the main table's).
The options are the ones under which the two libraries compute the same
numbers (``same_numbers`` checks it; the smoke test runs it for every pair),
mostly both libraries' defaults; the comments say where one side needs another
option to match the other.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import optax

import updax as ux

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (the side-by-side machinery of the main benchmark)

O, contrib = ux.optimizers, optax.contrib

#: name (of ``updax.optimizers``) -> (updax's optimizer, optax's), both built on call.
CATALOGUE = {
    # optax's default eps is 1e-16, updax's (Axon's) 0.
    "adabelief": (lambda: O.adabelief(1e-3, eps=1e-16), lambda: optax.adabelief(1e-3)),
    # optax's learning rate defaults to None (no scaling); updax's (Axon's) to 1.
    "adadelta": (lambda: O.adadelta(1.0), lambda: optax.adadelta(1.0)),
    "adafactor": (lambda: O.adafactor(1e-3), lambda: optax.adafactor(1e-3)),
    "adagrad": (lambda: O.adagrad(1e-3), lambda: optax.adagrad(1e-3)),
    # optax's default eps_root is 0, updax's (Axon's) 1e-15.
    "adam": (lambda: O.adam(1e-3, eps_root=0.0), lambda: optax.adam(1e-3)),
    "adamw": (lambda: O.adamw(1e-3, eps_root=0.0, decay=1e-4), lambda: optax.adamw(1e-3)),
    "adamax": (lambda: O.adamax(1e-3), lambda: optax.adamax(1e-3)),
    "adamaxw": (lambda: O.adamaxw(1e-3), lambda: optax.adamaxw(1e-3)),
    "ademamix": (lambda: O.ademamix(1e-3), lambda: contrib.ademamix(1e-3)),
    # optax 0.2.8's Adan weights the gradient differences by 1 - b2 where the paper has b2: equal at b2 = 0.5.
    "adan": (lambda: O.adan(1e-3, b2=0.5), lambda: optax.adan(1e-3, b2=0.5)),
    "adopt": (lambda: O.adopt(1e-3), lambda: contrib.adopt(1e-3)),
    "amsgrad": (lambda: O.amsgrad(1e-3), lambda: optax.amsgrad(1e-3)),
    "cocob": (lambda: O.cocob(), lambda: contrib.cocob()),
    "dadapt_adamw": (lambda: O.dadapt_adamw(), lambda: contrib.dadapt_adamw()),
    "dog": (lambda: O.dog(), lambda: contrib.dog()),
    "dowg": (lambda: O.dowg(), lambda: contrib.dowg()),
    "fromage": (lambda: O.fromage(1e-3), lambda: optax.fromage(1e-3)),
    # optax's default base optimizer, scale_by_adam(), is updax's built-in Adam with its defaults.
    "galore": (lambda: O.galore(1e-3), lambda: contrib.galore(1e-3)),
    "lamb": (lambda: O.lamb(1e-3, eps=1e-6, eps_root=0.0), lambda: optax.lamb(1e-3)),
    "lars": (lambda: O.lars(1e-3), lambda: optax.lars(1e-3)),
    "lion": (lambda: O.lion(1e-4), lambda: optax.lion(1e-4)),
    "madgrad": (lambda: O.madgrad(1e-2), lambda: contrib.madgrad(1e-2)),
    "muon": (lambda: O.muon(), lambda: contrib.muon(0.02)),
    "nadam": (lambda: O.nadam(1e-3), lambda: optax.nadam(1e-3)),
    "nadamw": (lambda: O.nadamw(1e-3), lambda: optax.nadamw(1e-3)),
    # No noise (eta = 0): the two libraries draw it from different keys. It is drawn and scaled all the same.
    "noisy_sgd": (lambda: O.noisy_sgd(1e-2, eta=0.0), lambda: optax.noisy_sgd(1e-2, eta=0.0, key=jax.random.key(0))),
    "novograd": (lambda: O.novograd(1e-3), lambda: optax.novograd(1e-3)),
    # optax's optimistic_adam_v2 defaults to Nesterov's first moment, updax's to Adam's.
    "optimistic_adam": (lambda: O.optimistic_adam(1e-3), lambda: optax.optimistic_adam_v2(1e-3, nesterov=False)),
    "optimistic_adam_v2": (lambda: O.optimistic_adam_v2(1e-3), lambda: optax.optimistic_adam_v2(1e-3)),
    "optimistic_gradient_descent": (lambda: O.optimistic_gradient_descent(1e-2),
                                    lambda: optax.optimistic_gradient_descent(1e-2)),
    "prodigy": (lambda: O.prodigy(), lambda: contrib.prodigy()),
    "radam": (lambda: O.radam(1e-3), lambda: optax.radam(1e-3)),
    "rmsprop": (lambda: O.rmsprop(1e-3), lambda: optax.rmsprop(1e-3)),
    # optax 0.2.8 returns the previous step's update (0 on the first): the same rule one step late.
    "rprop": (lambda: O.rprop(1e-3), lambda: optax.rprop(1e-3)),
    "schedule_free_adamw": (lambda: O.schedule_free_adamw(), lambda: contrib.schedule_free_adamw()),
    "schedule_free_sgd": (lambda: O.schedule_free_sgd(), lambda: contrib.schedule_free_sgd()),
    "sgd": (lambda: O.sgd(1e-2, momentum=0.9), lambda: optax.sgd(1e-2, momentum=0.9)),
    "sign_sgd": (lambda: O.sign_sgd(1e-3), lambda: optax.sign_sgd(1e-3)),
    "signum": (lambda: O.signum(1e-3), lambda: optax.signum(1e-3)),
    "simplified_ademamix": (lambda: O.simplified_ademamix(1e-3), lambda: contrib.simplified_ademamix(1e-3)),
    "sm3": (lambda: O.sm3(1e-2), lambda: optax.sm3(1e-2)),
    "yogi": (lambda: O.yogi(1e-2), lambda: optax.yogi(1e-2)),
}

#: Other options of the catalogue's optimizers, and wrappers around them, run only when named (``--recipes
#: adam/b1=0.5``): each a case where the option changes the program.
OPTIONS = {
    # DCGAN's Adam. A decay of 0.5 makes both weights of a moving average the same number, which XLA factors out
    # (updax._backend._half).
    "adam/b1=0.5": (lambda: O.adam(2e-4, b1=0.5, eps_root=0.0), lambda: optax.adam(2e-4, b1=0.5)),
    # Gradient accumulation: the inner step on every 3rd call, zeros otherwise (optax's MultiSteps); 3, so that
    # same_numbers' 3 steps include one that updates.
    "adam/accumulate_gradients": (lambda: ux.accumulate_gradients(O.adam(1e-3, eps_root=0.0), 3),
                                  lambda: optax.MultiSteps(optax.adam(1e-3), 3)),
    # The same around a rule that is not elementwise (LAMB's trust ratio per leaf), which runs in a lax.cond where
    # an elementwise one is computed on every call and selected.
    "lamb/accumulate_gradients": (lambda: ux.accumulate_gradients(O.lamb(1e-3, eps=1e-6, eps_root=0.0), 3),
                                  lambda: optax.MultiSteps(optax.lamb(1e-3), 3)),
    # Mixed-precision training's skip of non-finite steps (optax's checks the gradients only, updax's the
    # pipeline's output too).
    "adam/apply_if_finite": (lambda: ux.apply_if_finite(O.adam(1e-3, eps_root=0.0), 5),
                             lambda: optax.apply_if_finite(optax.adam(1e-3), 5)),
}

#: The pairs of both tables, by name.
ALL = {**CATALOGUE, **OPTIONS}

#: The optimizers left out, and why: their ``update`` needs more than the gradients, the state and the params,
#: or optax has no such rule.
LEFT_OUT = {
    "dpsgd": "takes per-example gradients",
    "lbfgs": "takes the objective's value and its function (a line search)",
    "polyak_sgd": "takes the objective's value",
    "momo": "takes the objective's value", "momo_adam": "takes the objective's value",
    "shampoo": "optax 0.2.8 has no Shampoo", "soap": "optax 0.2.8 has no SOAP",
    "sophia": "takes the objective's function (Hutchinson's estimate of the Hessian's diagonal)",
    "mars_adamw": "optax 0.2.8 has no MARS", "mars_lion": "optax 0.2.8 has no MARS",
    "normuon": "not in optax 0.2.8 (its NorMuon is an open pull request)",
    "psgd_kron": "optax 0.2.8 has no PSGD",
    "laprop": "optax 0.2.8 has no LaProp",
    "acprop": "optax 0.2.8 centres on the previous momentum, against its documentation (its pull request 1716)",
}


#: The pairs whose numbers differ by design (see the comments above): ``same_numbers`` does not hold for them.
LAGGED = {"rprop"}


def same_numbers(name, params):
    """The largest difference between the two sides' params after 3 donated jitted steps, relative to the
    largest change optax made to that leaf (``run.check_equal``)."""
    steps = [(run.make_step(opt), opt.init(params)) for opt in (make() for make in ALL[name])]
    return run.check_equal(steps, params)
