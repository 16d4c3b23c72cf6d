"""Calibration: where step costs come from.

* :mod:`calibration.shapes` - model shapes (Qwen3 presets, an MoE approximation), parameter counts;
* :mod:`calibration.roofline` / :mod:`calibration.drafter_cost` - analytic profiles (``source: analytic``);
* :mod:`calibration.model` / :mod:`calibration.drafters` - the torch verifier and drafters (random weights);
* :mod:`calibration.specdec` - real speculative decoding with those models and a policy;
* :mod:`calibration.serving` / :mod:`calibration.serving_batch` - a real continuous-batching serving loop on those
  models (the simulator's engine model, wall clock, the simulator's tables); :mod:`calibration.loop_costs` - what the
  loop costs beyond its forward passes, for a profile; :mod:`calibration.validate` /
  :mod:`calibration.validation_report` - the simulator's predictions against the loop (``docs/validation.md``);
* :mod:`calibration.profile_gpu` - measured profiles (``source: measured``); :mod:`calibration.compare` plots both;
* :mod:`calibration.corpora` / :mod:`calibration.train` / :mod:`calibration.checkpoints` - a byte-level target and
  the four drafters trained on CPU (``docs/acceptance_logs.md``);
* :mod:`calibration.evaluate` - measure the trained drafters and write an acceptance log (the format and
  sequential temperature scaling live in :mod:`simulator.acceptance.logs` and :mod:`calibration.acceptance.sts`).

Torch is imported only by the torch modules; the roofline needs numpy alone.
"""
