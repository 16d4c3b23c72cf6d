"""The typed schema of ``python -m experiments.run``: Hydra structured configs, checked before a run.

Every plain key and config group has a dataclass here, stored in Hydra's
``ConfigStore``. Hydra checks key names and types while it composes
(``seed=abc``, ``policy.thta=0.5``); :func:`validate` then instantiates the
dataclasses, whose ``__post_init__`` checks ranges and choices and builds the
simulator's own specs, so that their checks run too. Every failure is a
:class:`ConfigError` whose message names the key, the value and what is valid.

Schemas are built from the dataclasses the simulator already has
(:func:`experiments.mirror.mirror`): the policy dataclasses of
:func:`policies.policy_classes`, ``TrafficSpec``, ``ReplayOptions``,
``DrafterSpec``, ``EngineLimits`` and ``ClusterSpec``, ``ConfidenceSpec`` and
``DifficultySpec``, with ``Literal`` fields checked against their allowed values. The ``policy``
and ``traffic`` groups hold different keys per option, so each option's yaml
names its schema in its defaults list (``/schema/policy/<name>@_here_``); a new
policy gets its schema from its dataclass, with nothing to add here.
"""

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from experiments.mirror import ConfigError, mirror, one_of, open_mappings, plain_fields
from policies import Policy, make_policy, policy_classes
from simulator import ClusterSpec, ConfidenceSpec, DifficultySpec, DrafterSpec, EngineLimits
from simulator.acceptance.presets import DRAFTERS
from traces.formats import FORMATS
from traces.load import SAMPLES
from traces.replay import ReplayOptions
from traces.synthetic import TrafficSpec
from traces.workload import DOMAINS


def _at_least(key: str, value: float, low: float) -> None:
    if not value >= low:
        raise ConfigError(f"{key}={value}: must be >= {low:g}")


def _finite_above(key: str, value: float, low: float, inclusive: bool = False) -> None:
    ok = value >= low if inclusive else value > low
    if not (math.isfinite(value) and ok):
        raise ConfigError(f"{key}={value}: must be a finite number {'>=' if inclusive else '>'} {low:g}")


# ---------------------------------------------------------------- policies


def _build_policy(family: str, self: Any) -> Policy:
    try:
        return make_policy(self.name, **self.spec_fields())
    except ValueError as err:
        # Policies say "<family>: <field> must ..."; name the field by its config key instead.
        message, head = str(err), f"{family}: "
        raise ConfigError(f"policy.{message[len(head):]}" if message.startswith(head) else message) from err


def _check_mtp_name(self: Any) -> None:
    # ``mtp3`` is shorthand for mtp with k = 3: a different policy.k would run a policy its name hides.
    if self.name.startswith("mtp") and self.name[3:].isdigit() and int(self.name[3:]) != self.k:
        raise ConfigError(f"policy.k={self.k}: policy={self.name} fixes k={self.name[3:]}; "
                          f"use policy=mtp policy.k={self.k}")


def policy_schema(name: str) -> type:
    """The schema of policy ``name``: ``name`` plus the fields of its dataclass."""
    cls = policy_classes()[name]
    return mirror(cls, "policy", extra=(("name", str, name),), build=functools.partial(_build_policy, name),
                  check=_check_mtp_name if name == "mtp" else None)


# ---------------------------------------------------------------- traffic


def _check_lengths(self: Any) -> None:
    unknown = sorted(set(self.lengths) - set(DOMAINS))
    if unknown:
        raise ConfigError(f"traffic.lengths: unknown domain(s) {', '.join(unknown)}; valid: {', '.join(DOMAINS)}")
    for domain, spec in self.lengths.items():
        for key in ("prompt_median_tokens", "output_median_tokens"):
            _finite_above(f"traffic.lengths.{domain}.{key}", getattr(spec, key), 0.0)
        for key in ("prompt_sigma", "output_sigma"):
            _finite_above(f"traffic.lengths.{domain}.{key}", getattr(spec, key), 0.0, inclusive=True)


# A benchmark mix (benchmark -> weight) picks, within each domain, the preset's benchmark curve a request follows
# (docs/acceptance.md); experiments.config hands it to the drafter spec.
BENCHMARK_MIX = ("benchmark_mix", Any, None)  # Any: an override cannot merge into a typed null mapping
SyntheticTrafficConfig = mirror(TrafficSpec, "traffic", extra=(("name", str, "synthetic"), BENCHMARK_MIX),
                                check=_check_lengths)


def _check_trace(self: Any) -> None:
    one_of("traffic.arrival", self.arrival, ("trace",))
    if self.format is not None:
        one_of("traffic.format", self.format, FORMATS)
    if self.trace not in SAMPLES and not Path(self.trace).expanduser().is_file():
        raise ConfigError(f"traffic.trace={self.trace}: no such file, and not a shipped sample "
                          f"({', '.join(SAMPLES)})")


TraceTrafficConfig = mirror(
    ReplayOptions, "traffic", skip=("seed",),  # the run's seed draws any domain_mix
    extra=(("name", str, "trace"), ("arrival", str, "trace"), ("trace", str, MISSING), ("format", str | None, None),
           BENCHMARK_MIX),
    check=_check_trace)


# ---------------------------------------------------------------- drafter, acceptance, cluster, the run


# ConfidenceSpec and DifficultySpec check their own values, naming acceptance.* keys.
ConfidenceConfig = mirror(ConfidenceSpec, "acceptance.confidence")
DifficultyConfig = mirror(DifficultySpec, "acceptance.difficulty")


@dataclass
class AcceptanceConfig:
    """The parametric acceptance model's confidence head and request difficulty."""

    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)  # type: ignore[valid-type]
    difficulty: DifficultyConfig = field(default_factory=DifficultyConfig)  # type: ignore[valid-type]


PARQUET_MAGIC = b"PAR1"


def _check_drafter(self: Any) -> None:
    one_of("drafter.kind", self.kind, DRAFTERS)
    _at_least("drafter.gamma", self.gamma, 0)
    if self.log is not None:
        path = Path(self.log).expanduser()
        if not path.is_file():
            raise ConfigError(f"drafter.log={self.log}: no such file (an acceptance log, docs/acceptance_logs.md)")
        with path.open("rb") as f:
            if f.read(4) != PARQUET_MAGIC:
                raise ConfigError(f"drafter.log={self.log}: not a parquet file; an acceptance log is parquet "
                                  "(docs/acceptance_logs.md)")


# ``drafter.*``: DrafterSpec's fields but its acceptance model, which the top-level ``acceptance`` key holds, and
# its benchmark mix, which traffic.benchmark_mix holds.
DrafterConfig = mirror(DrafterSpec, "drafter", skip=("confidence", "difficulty", "benchmark_mix"),
                       check=_check_drafter)


_CLUSTER_FIELDS = plain_fields(ClusterSpec, skip=("limits",))


def _check_cluster(self: Any) -> None:
    for key in ("num_decode_engines", "num_prefill_instances", "max_concurrency", "kv_capacity_tokens"):
        _at_least(f"cluster.{key}", getattr(self, key), 1)


def _build_cluster(self: Any) -> ClusterSpec:
    return ClusterSpec(**{name: getattr(self, name) for name, _, _ in _CLUSTER_FIELDS},
                       limits=EngineLimits(**self.spec_fields()))


# ``cluster.*``: ClusterSpec's fields with its EngineLimits flattened in (cluster.max_concurrency, ...).
ClusterConfig = mirror(EngineLimits, "cluster", extra=_CLUSTER_FIELDS, build=_build_cluster, check=_check_cluster)


@dataclass
class RunConfig:
    """The root config of one simulation (``experiments/conf/config.yaml`` fills it in)."""

    policy: Any = MISSING  # a policy schema (policy_schema), chosen by the policy group
    traffic: Any = MISSING  # SyntheticTrafficConfig or TraceTrafficConfig, chosen by the traffic group
    drafter: DrafterConfig = field(default_factory=DrafterConfig)  # type: ignore[valid-type]
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # type: ignore[valid-type]
    acceptance: AcceptanceConfig = field(default_factory=AcceptanceConfig)
    hardware: str = "h200_qwen3-8b_analytic"  # a built-in profile name or a profile JSON path
    seed: int = 0
    duration_s: float | None = 60.0  # None runs an open-loop workload to completion
    warmup_s: float = 10.0
    progress: bool = True
    write_tables: bool = True
    interval_jobs: int = -1  # processes for a fitted profile's alternatives (joblib; -1: one per CPU)
    drafter_by_policy: dict[str, str] | None = None  # presets: the drafter kind each policy runs with

    def __post_init__(self) -> None:
        _at_least("seed", self.seed, 0)
        if self.interval_jobs == 0 or self.interval_jobs < -1:
            raise ConfigError(f"interval_jobs={self.interval_jobs}: a number of processes >= 1, or -1 for one per "
                              "CPU")
        if self.duration_s is not None:
            _finite_above("duration_s", self.duration_s, 0.0)
        _finite_above("warmup_s", self.warmup_s, 0.0, inclusive=True)
        if self.duration_s is not None and self.warmup_s >= self.duration_s:
            raise ConfigError(f"warmup_s={self.warmup_s}: must be < duration_s={self.duration_s} "
                              "(the metrics window is duration_s - warmup_s)")


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (``config.yaml`` and the group yamls refer to them)."""
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)
    for name in policy_classes():
        store.store(group="schema/policy", name=name, node=policy_schema(name))
    store.store(group="schema/traffic", name="synthetic", node=open_mappings(SyntheticTrafficConfig))
    store.store(group="schema/traffic", name="trace", node=open_mappings(TraceTrafficConfig))


register_configs()


def _check_keys(node: DictConfig, where: str) -> None:
    """Keys added with ``+key=value`` are not in the schema: name them with the valid keys."""
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        valid = [f.name for f in dataclasses.fields(schema)]
        for key in node:
            if key not in valid:
                raise ConfigError(f"{where}{key}: unknown key; valid keys: {', '.join(valid)}")
    for key in node:
        child = node._get_node(key)  # type: ignore[union-attr]
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            _check_keys(child, f"{where}{key}.")


def validate(cfg: DictConfig) -> RunConfig:
    """The composed ``cfg`` as a checked :class:`RunConfig`; raises :class:`ConfigError`."""
    if OmegaConf.get_type(cfg) is not RunConfig:
        raise ConfigError("the config was not composed from experiments/conf/config.yaml (no run_schema)")
    if "hydra" in cfg:  # compose(..., return_hydra_config=True)
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    _check_keys(cfg, "")
    try:
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} is required: set {err.full_key}=...") from err
    except OmegaConfBaseException as err:
        cause = err.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(str(err).splitlines()[0]) from err
