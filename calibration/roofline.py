"""The analytic profile's command, ``python -m calibration.roofline`` (code: :mod:`calibration.profiling.analytic`)."""

from calibration.profiling.analytic import main

if __name__ == "__main__":
    main()
