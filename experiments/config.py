"""Turn a Hydra ``DictConfig`` into the simulator's typed specs (Hydra stops here)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from policies import Policy, make_policy
from simulator import ClusterSpec, ConfidenceSpec, DifficultySpec, DrafterSpec, EngineLimits, SimulationSpec
from simulator.acceptance.presets import DRAFTERS
from simulator.profile import load_profile
from traces import load_trace_workload
from traces.synthetic import TrafficSpec
from traces.workload import Workload


def _plain(node: Any) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}  # type: ignore[return-value]


def construct(cls: type, params: dict[str, Any], where: str) -> Any:
    """``cls(**params)`` with an error that names the config group and the valid keys."""
    valid = set(getattr(cls, "__dataclass_fields__", {}))
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(valid))}")
    return cls(**params)


def build_policy(cfg: DictConfig) -> Policy:
    params = _plain(cfg)
    return make_policy(params.pop("name"), **params)


def build_drafter(cfg: DictConfig, acceptance: DictConfig) -> DrafterSpec:
    if cfg.kind not in DRAFTERS:
        raise ValueError(f"unknown drafter {cfg.kind!r}; valid drafters: {', '.join(DRAFTERS)}")
    acc = _plain(acceptance)
    return DrafterSpec(kind=cfg.kind, gamma=int(cfg.gamma), log=cfg.get("log"), log_order=cfg.get("log_order", "auto"),
                       confidence=construct(ConfidenceSpec, acc.get("confidence", {}), "acceptance.confidence"),
                       difficulty=construct(DifficultySpec, acc.get("difficulty", {}), "acceptance.difficulty"))


def build_cluster(cfg: DictConfig) -> ClusterSpec:
    c = _plain(cfg)
    limits = EngineLimits(max_concurrency=int(c.pop("max_concurrency")),
                          kv_capacity_tokens=int(c.pop("kv_capacity_tokens")))
    return construct(ClusterSpec, {"limits": limits, **c}, "cluster")


def build_traffic(cfg: DictConfig, seed: int) -> TrafficSpec | Workload:
    t = _plain(cfg)
    t.pop("name", None)
    if t.get("arrival") == "trace":
        t.pop("arrival")
        return load_trace_workload(t.pop("trace"), format=t.pop("format", None), seed=seed, **t)
    return construct(TrafficSpec, t, "traffic")


def build_spec(cfg: DictConfig) -> SimulationSpec:
    return SimulationSpec(
        policy=build_policy(cfg.policy),
        profile=load_profile(cfg.hardware),
        drafter=build_drafter(cfg.drafter, cfg.acceptance),
        cluster=build_cluster(cfg.cluster),
        traffic=build_traffic(cfg.traffic, int(cfg.seed)),
        duration_s=cfg.duration_s,
        warmup_s=float(cfg.warmup_s),
        seed=int(cfg.seed),
    )
