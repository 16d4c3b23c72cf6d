"""How often a drafter's tokens are accepted, and how confident it is: the acceptance sources.

* :mod:`simulator.acceptance.source` - the contract (:class:`AcceptanceSource`);
* :mod:`simulator.acceptance.curves` - acceptance curves q_k (conditional acceptance per position);
* :mod:`simulator.acceptance.preset_file` / :mod:`simulator.acceptance.presets` - preset files (curves per
  domain and benchmark of one drafter on one target) and the built-in ones (the paper's Table 1 rows);
* :mod:`simulator.acceptance.paper` - the DSpark paper's published acceptance figures;
* :mod:`simulator.acceptance.latent` / :mod:`simulator.acceptance.parametric` - the parametric model fitted to a
  preset (outcomes, confidence head) and the source built on it;
* :mod:`simulator.acceptance.online` - an online logistic acceptance estimator, a confidence source;
* :mod:`simulator.acceptance.offline` - the paper's offline protocol on a source alone (fit checks);
* :mod:`simulator.acceptance.replay` / :mod:`simulator.acceptance.logs` - replay of a real run's acceptance log,
  and the log format.

Building presets (``python -m calibration.acceptance.fit_acceptance``) and confidence calibration (STS) are
offline tools in :mod:`calibration.acceptance`.
"""

from simulator.acceptance.latent import DifficultySpec
from simulator.acceptance.parametric import AcceptanceModel, ConfidenceSpec
from simulator.acceptance.replay import LoggedAcceptance
from simulator.acceptance.source import AcceptanceSource

__all__ = ["AcceptanceModel", "AcceptanceSource", "ConfidenceSpec", "DifficultySpec", "LoggedAcceptance"]
