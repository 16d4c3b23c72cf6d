"""The comparison figure's command, ``python -m calibration.compare`` (code: :mod:`calibration.profiling.compare`)."""

from calibration.profiling.compare import main

if __name__ == "__main__":
    main()
