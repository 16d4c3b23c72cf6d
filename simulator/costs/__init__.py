"""What things cost: hardware profiles (versions 1 and 2), their tables, and the writer's typed blocks.

* :mod:`simulator.costs.tables` - 1-D and 2-D tables and the drafter's latency table (interpolated inside,
  an error outside that names the profile file);
* :mod:`simulator.costs.profile` - :class:`HardwareProfile`: the dense part with its CUDA-graph cliff,
  per-request overhead, attention over (context, query tokens), prefill chunks, drafter and scheduler;
* :mod:`simulator.costs.schema` - the file format: reading and checking it, migrating version 1;
* :mod:`simulator.costs.blocks` - typed version-2 blocks for programs that write profiles.

The format is documented in ``docs/profile_format.md``.
"""

from simulator.costs.blocks import (
    AttentionBlock,
    ChunkAttentionBlock,
    ContextDraftTable,
    CudaGraphsBlock,
    PrefillTableBlock,
    TokenBudgetBlock,
    Version2Blocks,
)
from simulator.costs.fields import ProfileError
from simulator.costs.profile import CudaGraphs, HardwareProfile, KeyPadding
from simulator.costs.schema import (
    BUILTIN_DIR,
    FIELDS,
    PROFILE_FORMAT,
    PROFILE_VERSION,
    READABLE_VERSIONS,
    SOURCES,
    builtin_profiles,
    load_profile,
    migrate,
    profile_from_dict,
    profile_to_dict,
    resolve_profile_path,
)
from simulator.costs.tables import DraftTable, Table1D, Table2D

__all__ = [
    "BUILTIN_DIR", "FIELDS", "PROFILE_FORMAT", "PROFILE_VERSION", "READABLE_VERSIONS", "SOURCES", "AttentionBlock",
    "ChunkAttentionBlock", "ContextDraftTable", "CudaGraphs", "CudaGraphsBlock", "DraftTable", "HardwareProfile",
    "KeyPadding", "PrefillTableBlock", "ProfileError", "Table1D", "Table2D", "TokenBudgetBlock", "Version2Blocks",
    "builtin_profiles", "load_profile", "migrate", "profile_from_dict", "profile_to_dict", "resolve_profile_path",
]
