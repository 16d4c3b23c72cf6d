"""Where step costs come from: hardware profiles, analytic and measured, in the simulator's format.

* :mod:`calibration.profiling.roofline` / :mod:`calibration.profiling.drafter_cost` - the analytic cost model of
  the verifier and the drafters (numpy only); :mod:`calibration.profiling.analytic` turns it into a profile
  (``python -m calibration.roofline``);
* :mod:`calibration.profiling.timing` / :mod:`calibration.profiling.calls` - warm-up, synchronise, repeat; the
  verifier and drafter calls that are timed;
* :mod:`calibration.profiling.measure` - a measured profile of the torch models (``source: measured``), with the
  command :mod:`calibration.profiling.profile_gpu` (``python calibration/profile_gpu.py``);
* :mod:`calibration.profiling.loop_costs` - what the real serving loop costs beyond its forward passes, folded
  into a measured profile;
* :mod:`calibration.profiling.profile_file` - the one writer of profile files; :mod:`calibration.profiling.revision`
  - the code's git revision, which run summaries and measured profiles record (no torch);
* :mod:`calibration.profiling.compare` - measured against analytic step rates, as a figure.

Imports :mod:`calibration.models` and (for the loop costs) :mod:`calibration.serving`.
"""
