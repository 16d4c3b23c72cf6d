"""The typed schema of ``python -m experiments.run``: Hydra structured configs, checked before a run.

Every plain key and config group has a dataclass here, stored in Hydra's
``ConfigStore``. Hydra checks key names and types while it composes
(``seed=abc``, ``policy.thta=0.5``); :func:`validate` then instantiates the
dataclasses, whose ``__post_init__`` checks ranges and choices and builds the
simulator's own specs, so that their checks run too. Every failure is a
:class:`ConfigError` whose message names the key, the value and what is valid.

Schemas are built from the dataclasses the simulator already has
(:func:`mirror`): the policy dataclasses of :func:`policies.policy_classes`,
``TrafficSpec``, ``ReplayOptions``, ``ConfidenceSpec`` and ``DifficultySpec``,
with ``Literal`` fields checked against their allowed values. The ``policy``
and ``traffic`` groups hold different keys per option, so each option's yaml
names its schema in its defaults list (``/schema/policy/<name>@_here_``); a new
policy gets its schema from its dataclass, with nothing to add here.
"""

import dataclasses
import functools
import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from policies import Policy, make_policy, policy_classes
from simulator import ClusterSpec, ConfidenceSpec, DifficultySpec, DrafterSpec, EngineLimits
from simulator.acceptance.presets import DRAFTERS
from traces.formats import FORMATS
from traces.load import SAMPLES
from traces.replay import ReplayOptions
from traces.synthetic import TrafficSpec
from traces.workload import DOMAINS


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, the value and what is valid."""


def _at_least(key: str, value: float, low: float) -> None:
    if not value >= low:
        raise ConfigError(f"{key}={value}: must be >= {low:g}")


def _finite_above(key: str, value: float, low: float, inclusive: bool = False) -> None:
    ok = value >= low if inclusive else value > low
    if not (math.isfinite(value) and ok):
        raise ConfigError(f"{key}={value}: must be a finite number {'>=' if inclusive else '>'} {low:g}")


def _one_of(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value}: must be one of {', '.join(map(str, allowed))}")


# ---------------------------------------------------------------- schemas from existing dataclasses


def _config_type(hint: Any) -> tuple[Any, tuple | None]:
    """The type OmegaConf checks for a field annotated ``hint`` and, for a ``Literal``, its allowed values."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return type(args[0]), args
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner, allowed = _config_type(rest[0])
            return inner | None, allowed
        return Any, None
    if origin in (dict, Mapping):
        return dict[str, _config_type(args[1])[0]], None  # type: ignore[misc]
    if dataclasses.is_dataclass(hint):
        return mirror(hint, ""), None  # type: ignore[arg-type]
    return (hint, None) if hint in (int, float, str, bool) else (Any, None)


def _as_config(value: Any) -> Any:
    """A default value as its schema holds it: dataclass values become their mirrors."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return mirror(type(value), "")(**{f.name: _as_config(getattr(value, f.name))
                                           for f in dataclasses.fields(value) if f.init})
    if isinstance(value, Mapping):
        return {k: _as_config(v) for k, v in value.items()}
    return value


def _as_spec(value: Any) -> Any:
    """A validated config value as the simulator takes it: mirrors become the dataclasses they mirror."""
    if hasattr(value, "to_spec"):
        return value.to_spec()
    if isinstance(value, Mapping):
        return {k: _as_spec(v) for k, v in value.items()}
    return value


def _null_mapping(f: dataclasses.Field, hint: Any) -> bool:
    """An optional mapping that defaults to None (ReplayOptions.domain_map)."""
    rest = [a for a in get_args(hint) if a is not type(None)]
    return f.default is None and len(rest) == 1 and get_origin(rest[0]) in (dict, Mapping)


def _default(f: dataclasses.Field, hint: Any) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if isinstance(value, Mapping) and not all(dataclasses.is_dataclass(v) for v in value.values()):
            # A yaml's mapping merges into the schema's (keys add up), so a plain mapping such as
            # domain_mix has no schema default: each option's yaml states it whole.
            return field(default=MISSING)
        return field(default_factory=functools.partial(lambda make: _as_config(make()), f.default_factory))
    if f.default is dataclasses.MISSING:
        return field(default=MISSING)
    if _null_mapping(f, hint):
        # An override cannot merge into a null mapping (traffic.domain_map={a: b} would fail), so the schema
        # starts it empty, and an empty mapping stands for None again (spec_fields).
        return field(default_factory=dict)
    if dataclasses.is_dataclass(f.default) or isinstance(f.default, Mapping):
        return field(default_factory=functools.partial(_as_config, f.default))
    return field(default=f.default)


@functools.cache
def mirror(cls: type, where: str, skip: tuple[str, ...] = (), extra: tuple[tuple[str, Any, Any], ...] = (),
           build: Callable[[Any], Any] | None = None, check: Callable[[Any], None] | None = None) -> type:
    """A mutable dataclass with the init fields of ``cls`` (less ``skip``) in types OmegaConf knows, after the
    ``extra`` fields ``(name, type, default)``.

    Instantiating it (``OmegaConf.to_object``) checks ``Literal`` fields against their values, runs ``check``
    and builds the real value (``cls(**self.spec_fields())``, or ``build(self)``) so that ``cls``'s own checks
    run; any error is a :class:`ConfigError` that starts with ``where``. ``to_spec()`` returns the real value.
    """
    hints = get_type_hints(cls)
    own = [f for f in dataclasses.fields(cls) if f.init and f.name not in skip]
    allowed = {f.name: _config_type(hints[f.name])[1] for f in own}
    null_mappings = {f.name for f in own if _null_mapping(f, hints[f.name])}
    fields_ = [(name, tp, field(default=default)) for name, tp, default in extra]
    fields_ += [(f.name, _config_type(hints[f.name])[0], _default(f, hints[f.name])) for f in own]

    def spec_fields(self: Any) -> dict[str, Any]:
        """The mirrored fields as ``cls`` takes them."""
        values = {f.name: _as_spec(getattr(self, f.name)) for f in own}
        return {k: None if k in null_mappings and not v else v for k, v in values.items()}

    def to_spec(self: Any) -> Any:
        return cls(**spec_fields(self)) if build is None else build(self)

    def __post_init__(self: Any) -> None:
        for name, values in allowed.items():
            value = getattr(self, name)
            if values is not None and value is not None:
                _one_of(f"{where}.{name}", value, values)
        if check is not None:
            check(self)
        try:
            to_spec(self)
        except ConfigError:
            raise
        except (ValueError, TypeError) as err:
            message = str(err)
            raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from err

    namespace = {"spec_fields": spec_fields, "to_spec": to_spec, "__post_init__": __post_init__,
                 "__module__": __name__}
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields_, namespace=namespace)


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


SyntheticTrafficConfig = mirror(TrafficSpec, "traffic", extra=(("name", str, "synthetic"),), check=_check_lengths)


def _check_trace(self: Any) -> None:
    _one_of("traffic.arrival", self.arrival, ("trace",))
    if self.format is not None:
        _one_of("traffic.format", self.format, FORMATS)
    if self.trace not in SAMPLES and not Path(self.trace).expanduser().is_file():
        raise ConfigError(f"traffic.trace={self.trace}: no such file, and not a shipped sample "
                          f"({', '.join(SAMPLES)})")


TraceTrafficConfig = mirror(
    ReplayOptions, "traffic", skip=("seed",),  # the run's seed draws any domain_mix
    extra=(("name", str, "trace"), ("arrival", str, "trace"), ("trace", str, MISSING), ("format", str | None, None)),
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
    _one_of("drafter.kind", self.kind, DRAFTERS)
    _at_least("drafter.gamma", self.gamma, 0)
    if self.log is not None:
        path = Path(self.log).expanduser()
        if not path.is_file():
            raise ConfigError(f"drafter.log={self.log}: no such file (an acceptance log, docs/acceptance_logs.md)")
        with path.open("rb") as f:
            if f.read(4) != PARQUET_MAGIC:
                raise ConfigError(f"drafter.log={self.log}: not a parquet file; an acceptance log is parquet "
                                  "(docs/acceptance_logs.md)")


# ``drafter.*``: DrafterSpec's fields but its acceptance model, which the top-level ``acceptance`` key holds.
DrafterConfig = mirror(DrafterSpec, "drafter", skip=("confidence", "difficulty"), check=_check_drafter)


def _plain_fields(cls: type, skip: tuple[str, ...]) -> tuple[tuple[str, Any, Any], ...]:
    """``(name, type, default)`` of the plain init fields of ``cls``, for :func:`mirror`'s ``extra``."""
    hints = get_type_hints(cls)
    return tuple((f.name, _config_type(hints[f.name])[0], f.default) for f in dataclasses.fields(cls)
                 if f.init and f.name not in skip)


_CLUSTER_FIELDS = _plain_fields(ClusterSpec, skip=("limits",))


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
    drafter_by_policy: dict[str, str] | None = None  # presets: the drafter kind each policy runs with

    def __post_init__(self) -> None:
        _at_least("seed", self.seed, 0)
        if self.duration_s is not None:
            _finite_above("duration_s", self.duration_s, 0.0)
        _finite_above("warmup_s", self.warmup_s, 0.0, inclusive=True)
        if self.duration_s is not None and self.warmup_s >= self.duration_s:
            raise ConfigError(f"warmup_s={self.warmup_s}: must be < duration_s={self.duration_s} "
                              "(the metrics window is duration_s - warmup_s)")


def _open_mappings(schema: type) -> DictConfig:
    """``schema`` as a config whose mappings of plain values (``domain_mix``, ``domain_map``) take new keys
    without a ``+`` (``traffic.domain_map.support=chat``); Hydra makes every other node strict."""
    node = OmegaConf.structured(schema)
    for f in dataclasses.fields(schema):
        hint = f.type
        args = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) is types.UnionType else [hint]
        if len(args) == 1 and get_origin(args[0]) is dict and not dataclasses.is_dataclass(get_args(args[0])[1]):
            OmegaConf.set_struct(node._get_node(f.name), False)  # type: ignore[arg-type]
    return node


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (``config.yaml`` and the group yamls refer to them)."""
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)
    for name in policy_classes():
        store.store(group="schema/policy", name=name, node=policy_schema(name))
    store.store(group="schema/traffic", name="synthetic", node=_open_mappings(SyntheticTrafficConfig))
    store.store(group="schema/traffic", name="trace", node=_open_mappings(TraceTrafficConfig))


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
