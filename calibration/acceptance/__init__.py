"""Offline acceptance tools: preset building, real acceptance logs, preset fitting and confidence calibration (STS).

* :mod:`calibration.acceptance.fit_acceptance` - ``python -m calibration.acceptance.fit_acceptance``: a preset file
  from published numbers, a DeepSpec eval table or an acceptance log (:mod:`calibration.acceptance.inputs` reads
  them, :mod:`calibration.acceptance.build` makes the curves and the fit's check);
* :mod:`calibration.acceptance.confidence` - the parametric confidence head against the paper's Figure 6;
* :mod:`calibration.acceptance.evaluate` - decode held-out prompts with the trained models into an acceptance log;
* :mod:`calibration.acceptance.fit_preset` - an acceptance preset fitted to a log;
* :mod:`calibration.acceptance.sts` - sequential temperature scaling of a drafter's confidences, and its report.

``paper/`` holds the published numbers the built-in presets are made from. The simulator never imports this
package: it reads presets and logs through :mod:`simulator.acceptance`.
"""
