"""Offline acceptance tools: real acceptance logs, preset fitting and confidence calibration (STS).

* :mod:`calibration.acceptance.evaluate` - decode held-out prompts with the trained models into an acceptance log;
* :mod:`calibration.acceptance.fit_preset` - an acceptance preset fitted to a log;
* :mod:`calibration.acceptance.sts` - sequential temperature scaling of a drafter's confidences, and its report.

The simulator never imports this package: it reads presets and logs through :mod:`simulator.acceptance`.
"""
