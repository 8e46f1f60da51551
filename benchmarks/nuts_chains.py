"""NUTS at the numbers of chains users run: 4, 16, 100 and 1000 chains of four targets, ours
against TFP's NUTS, ``tfp.mcmc.sample_chain`` under XLA.

Most NUTS users run a handful of chains; a batched sampler earns its keep at hundreds.  This
benchmark covers the whole range on the targets of ``nuts_targets`` (the dense 100-d Gaussian,
the 10-d Gaussian with scales 0.1 to 10, the logistic regression, eight schools), timed as
there: ``NUM_STEPS`` steps of all chains per compiled call from the same start and seed,
throughput = the gradients the chains needed / median seconds per call over interleaved
rounds, and the first call (trace, compile, run).  BlackJAX is compared in ``nuts_targets``.

Run: ``.venv/bin/python -m benchmarks [--quick] nuts_chains``.
"""
from __future__ import annotations

import functools

from benchmarks import nuts_targets
from benchmarks.harness import Report

CHAINS = (4, 16, 100, 1000)
TARGETS = (functools.partial(nuts_targets.dense_gaussian, 100),
           nuts_targets.log_spaced_gaussian, nuts_targets.logistic,
           nuts_targets.eight_schools)


def targets(quick: bool) -> list[nuts_targets.Target]:
    if quick:
        return [nuts_targets.eight_schools(4), nuts_targets.dense_gaussian(100, 16)]
    return [make(chains) for make in TARGETS for chains in CHAINS]


def run(quick: bool) -> Report:
    return nuts_targets.compare("nuts_chains", targets(quick), quick, blackjax=False)
