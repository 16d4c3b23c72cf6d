"""How often a drafter's tokens are accepted, and how confident it is: the acceptance sources.

* :mod:`simulator.acceptance.source` - the contract (:class:`AcceptanceSource`);
* :mod:`simulator.acceptance.parametric` - the parametric model, built from a preset curve;
* :mod:`simulator.acceptance.presets` - the preset curves (the paper's Table 1 and Figure 2);
* :mod:`simulator.acceptance.replay` - replay of a real run's acceptance log;
* :mod:`simulator.acceptance.logs` - the acceptance-log format the replay reads (and the real runs write).

Fitting presets and confidence calibration (STS) are offline tools in :mod:`calibration.acceptance`.
"""

from simulator.acceptance.parametric import AcceptanceModel, ConfidenceSpec, DifficultySpec
from simulator.acceptance.replay import LoggedAcceptance
from simulator.acceptance.source import AcceptanceSource

__all__ = ["AcceptanceModel", "AcceptanceSource", "ConfidenceSpec", "DifficultySpec", "LoggedAcceptance"]
