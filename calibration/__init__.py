"""Calibration: where the simulator's step costs and acceptance come from, and how well it predicts a real loop.

Each subpackage owns one idea:

* :mod:`calibration.models` - model and drafter shapes, the trained models' presets (no torch), the torch verifier
  and drafters, and their checkpoints (shipped in ``calibration/models/weights/``);
* :mod:`calibration.training` - corpora and CPU training of the byte-level target and the four drafters
  (``docs/acceptance_logs.md``);
* :mod:`calibration.profiling` - hardware profiles: the analytic roofline (``source: analytic``, no torch), measured
  profiles of the torch models (``source: measured``), the serving loop's own costs, the one profile writer, and
  the comparison figure;
* :mod:`calibration.serving` - a real continuous-batching serving loop of real speculative decoding, written
  independently of the simulator's engine: the ground truth of the validation;
* :mod:`calibration.acceptance` - acceptance logs of the trained models, preset fitting and confidence
  calibration;
* :mod:`calibration.validation` - the simulator's predictions against the real loop (``docs/validation.md``).

Imports point one way, down the layers ``models``, ``training``, ``serving``, ``profiling``, ``acceptance``,
``validation``: a subpackage imports only those before it (``tests/test_calibration_layers.py`` checks).

The modules at this level are the commands' entry points (``python -m calibration.profile_gpu``, ``.roofline``,
``.compare``, ``.train``, ``.evaluate``, ``.validate``). Importing this package imports no torch; neither do
:mod:`calibration.models.shapes` and the analytic roofline.
"""
