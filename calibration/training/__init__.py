"""Training the byte-level target and the four drafters on CPU (``docs/acceptance_logs.md``).

* :mod:`calibration.training.corpora` - offline train and held-out text per domain, as byte arrays;
* :mod:`calibration.training.teacher_forcing` - batched training forwards, the same functions as inference;
* :mod:`calibration.training.train` - the losses, the training loops and ``python -m calibration.train``.

Imports :mod:`calibration.models` only.
"""
