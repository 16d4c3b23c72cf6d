"""The models: shapes and presets (no torch), the torch verifier and drafters, and their checkpoints.

* :mod:`calibration.models.shapes` - target shapes (Qwen3 presets, an MoE approximation) and drafter shapes
  (kinds, layer counts), shared by the analytic roofline and the torch models;
* :mod:`calibration.models.presets` - the trained byte-level models: vocabulary, target shape, drafter configs;
* :mod:`calibration.models.model` / :mod:`calibration.models.drafters` - the torch verifier and drafters;
* :mod:`calibration.models.checkpoints` - saving and loading trained weights (shipped in ``weights/``).

Nothing here imports another ``calibration`` subpackage.
"""
