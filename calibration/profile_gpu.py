"""The profiler's command, ``python calibration/profile_gpu.py`` or ``python -m calibration.profile_gpu``.

The code is :mod:`calibration.profiling.profile_gpu`. Run as a script, this file has ``calibration/`` on
``sys.path`` instead of the repository root: the ``calibration`` package is then found as installed (the
project's editable install), as for every other import of the project.
"""

from calibration.profiling.profile_gpu import main

if __name__ == "__main__":
    main()
