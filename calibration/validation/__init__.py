"""Sim-vs-real validation: the simulator's predictions against the real serving loop (``docs/validation.md``).

* :mod:`calibration.validation.setup` - the run's config, the served models, the profile and the acceptance log;
* :mod:`calibration.validation.report` - side-by-side tables and the frontier figure (pure);
* :mod:`calibration.validation.validate` - the experiment and ``python -m calibration.validate``.

The top of the arrows: imports :mod:`calibration.models`, :mod:`calibration.training` (corpus prompts),
:mod:`calibration.profiling`, :mod:`calibration.serving` and :mod:`calibration.acceptance`; nothing imports it.
"""
