"""``python -m calibration.fit_profile RESULTS... --out profile.json``: a profile fitted from benchmark results.

The code lives in :mod:`calibration.fitting` (readers, model, fit, identifiability,
export); ``docs/calibration.md`` explains the fields read and what a fit can and
cannot tell.
"""

from calibration.fitting.cli import main

if __name__ == "__main__":
    main()
