"""Hardware profiles: the step-cost tables that drive the simulator (kept as the import path of
:mod:`simulator.costs`, where the tables, the profile and the file format live).

The format (``specsched-hardware-profile``, versions 1 and 2) is documented in
``docs/profile_format.md``; what a step costs is in :mod:`simulator.costs.profile`.
"""

from simulator.costs import (
    BUILTIN_DIR,
    PROFILE_FORMAT,
    PROFILE_VERSION,
    READABLE_VERSIONS,
    SOURCES,
    CudaGraphs,
    DraftTable,
    HardwareProfile,
    ProfileError,
    Table1D,
    Table2D,
    builtin_profiles,
    load_profile,
    migrate,
    profile_from_dict,
    profile_to_dict,
    resolve_profile_path,
)

__all__ = [
    "BUILTIN_DIR", "PROFILE_FORMAT", "PROFILE_VERSION", "READABLE_VERSIONS", "SOURCES", "CudaGraphs", "DraftTable",
    "HardwareProfile", "ProfileError", "Table1D", "Table2D", "builtin_profiles", "load_profile", "migrate",
    "profile_from_dict", "profile_to_dict", "resolve_profile_path",
]
