"""The sim-vs-real validation's command, ``python -m calibration.validate`` (code:
:mod:`calibration.validation.validate`)."""

from calibration.validation.validate import main

if __name__ == "__main__":
    main()
