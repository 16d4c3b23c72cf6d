"""The training command, ``python -m calibration.train`` (code: :mod:`calibration.training.train`)."""

from calibration.training.train import main

if __name__ == "__main__":
    main()
