"""The attention-path benchmark's command, ``python -m calibration.attention_paths``
(code: :mod:`calibration.profiling.attention_paths`)."""

from calibration.profiling.attention_paths import main

if __name__ == "__main__":
    main()
