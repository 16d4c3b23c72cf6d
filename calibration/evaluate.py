"""The acceptance-log command, ``python -m calibration.evaluate`` (code: :mod:`calibration.acceptance.evaluate`)."""

from calibration.acceptance.evaluate import main

if __name__ == "__main__":
    main()
