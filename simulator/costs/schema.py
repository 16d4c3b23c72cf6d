"""The profile file format (``specsched-hardware-profile``, versions 1 and 2): reading, checking, migrating.

Every field, its unit and how the simulator uses it is documented in
``docs/profile_format.md``. Version 2 adds optional blocks to version 1 and
changes the meaning of no version-1 field, so a version-1 file is read
unchanged and :func:`profile_to_dict` migrates it by stamping version 2
(:func:`migrate`). A version-1 file that holds a version-2 field, a field the
format does not define, or a value outside its range is a :class:`ProfileError`
naming the file and the field.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np

from simulator.costs import fields as f
from simulator.costs.fields import ProfileError
from simulator.costs.profile import CudaGraphs, HardwareProfile
from simulator.costs.tables import DraftTable, Table1D, Table2D

PROFILE_FORMAT = "specsched-hardware-profile"
PROFILE_VERSION = 2  # the version this code writes; it reads READABLE_VERSIONS
READABLE_VERSIONS = (1, 2)
SOURCES = ("measured", "analytic", "fitted")
KEY_PADDING = ("none", "longest")
# verify's version-2 seconds per unit of work, each 0 when absent (_verify_seconds)
VERIFY_SECONDS = ("decode_token_s", "draft_token_s", "join_s", "leave_s", "wake_s")
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "profiles"
# Top-level fields in the order a writer puts them; the version-2 ones are optional.
FIELDS = ("format", "version", "metadata", "gpus_per_replica", "verify", "per_request", "attention", "cuda_graphs",
          "token_budget", "draft", "prefill", "scheduler")
V2_FIELDS = ("attention", "cuda_graphs", "token_budget", "verify.step_s", "verify.decode_token_s",
             "verify.draft_token_s", "verify.join_s", "verify.leave_s", "verify.wake_s",
             "draft.<kind>.context_tokens",
             "draft.<kind>.key_padding",
             "prefill.chunk_attention", "prefill.table", "prefill.mixed_step", "prefill.decode_tail_s")
MAX_DECODE_TAIL_STEPS = 8  # the most decode steps after a prefill that prefill.decode_tail_s may price


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.json"))


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """A path to an existing file, or the name of a built-in profile."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    builtin = BUILTIN_DIR / f"{name_or_path}.json"
    if builtin.is_file():
        return builtin
    raise FileNotFoundError(f"hardware profile {str(name_or_path)!r} is neither a file nor a built-in "
                            f"profile; built-in profiles: {', '.join(builtin_profiles())}")


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    path = resolve_profile_path(name_or_path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ProfileError(f"{path}: not valid JSON ({err})") from err
    return profile_from_dict(data, str(path))


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 (or 2) profile dictionary as version 2, fields in :data:`FIELDS` order (a deep copy)."""
    out = {key: copy.deepcopy(data[key]) for key in FIELDS if key in data}
    out["version"] = PROFILE_VERSION
    return out


def profile_to_dict(profile: HardwareProfile) -> dict[str, Any]:
    """The version-2 dictionary of a loaded profile; ``profile_from_dict`` of it prices every step the same."""
    return migrate(profile.raw)


# ---------------------------------------------------------------- reading


def _header(data: Any, origin: str) -> int:
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: a profile must be a JSON object, got {type(data).__name__}")
    if f.get(data, "format", "", origin) != PROFILE_FORMAT:
        raise ProfileError(f"{origin}: field 'format' must be {PROFILE_FORMAT!r}, got {data['format']!r}")
    version = f.get(data, "version", "", origin)
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise ProfileError(f"{origin}: field 'version' must be {' or '.join(map(str, READABLE_VERSIONS))}, "
                           f"got {version!r}")
    f.known_keys(data, FIELDS, "", origin)
    if version == 1:
        present = [k for k in ("attention", "cuda_graphs", "token_budget") if data.get(k) is not None]
        if present:
            raise ProfileError(f"{origin}: field '{present[0]}' needs version 2 (this file says version 1)")
    return version


def _needs_v2(version: int, present: bool, where: str, origin: str) -> None:
    if present and version < 2:
        raise ProfileError(f"{origin}: field '{where}' needs version 2 (this file says version 1)")


def _metadata(data: dict[str, Any], origin: str) -> dict[str, Any]:
    meta = f.get(data, "metadata", "", origin)
    for key in ("source", "device", "model", "created", "tool"):
        f.get(meta, key, "metadata.", origin)
    f.choice(meta["source"], SOURCES, "metadata.source", origin)
    return dict(meta)


def _verify_seconds(verify: dict[str, Any], key: str, version: int, origin: str) -> float:
    """A version-2 number of seconds in ``verify`` (``decode_token_s``: per decode token of a step;
    ``draft_token_s``: per verified draft token, a decode token beyond each request's first; ``join_s``,
    ``leave_s``: per request that joins the batch before a step, resp. finishes in it; ``wake_s``: the first step
    after the engine sat idle), >= 0, 0 when absent."""
    if key not in verify:
        return 0.0
    _needs_v2(version, True, f"verify.{key}", origin)
    return f.number(verify[key], f"verify.{key}", origin, True)


def _verify(data: dict[str, Any], version: int, origin: str) -> tuple[Table1D, Table1D | None, float]:
    verify = f.block(data, "verify", origin)
    f.known_keys(verify, ("batch_tokens", "steps_per_s", "step_s", "padded_slot_s", *VERIFY_SECONDS), "verify.", origin)
    tokens = f.axis(f.get(verify, "batch_tokens", "verify.", origin), "verify.batch_tokens", origin)
    padded = f.number(verify.get("padded_slot_s", 0.0), "verify.padded_slot_s", origin, True)
    what = "verify SPS over batch_tokens"
    if "step_s" in verify:
        _needs_v2(version, True, "verify.step_s", origin)
        if "steps_per_s" in verify:
            raise ProfileError(f"{origin}: fields 'verify.steps_per_s' and 'verify.step_s' exclude each other")
        step_s = f.values(verify["step_s"], tokens.size, "verify.step_s", origin)
        return (Table1D(tokens, 1.0 / step_s, what, origin),
                Table1D(tokens, step_s, "verify step_s over batch_tokens", origin), padded)
    sps = f.values(f.get(verify, "steps_per_s", "verify.", origin), tokens.size, "verify.steps_per_s", origin)
    return Table1D(tokens, sps, what, origin), None, padded


def _per_request(data: dict[str, Any], origin: str) -> Table1D | None:
    block = f.block(data, "per_request", origin, required=False)
    if block is None:
        return None
    f.known_keys(block, ("num_requests", "step_s"), "per_request.", origin)
    reqs = f.axis(f.get(block, "num_requests", "per_request.", origin), "per_request.num_requests", origin)
    cost = f.values(f.get(block, "step_s", "per_request.", origin), reqs.size, "per_request.step_s", origin,
                    allow_zero=True)
    return Table1D(reqs, cost, "per-request step cost over num_requests", origin)


def _drafts(data: dict[str, Any], version: int, origin: str) -> dict[str, DraftTable]:
    drafts: dict[str, DraftTable] = {}
    for kind, block in f.block(data, "draft", origin).items():
        where = f"draft.{kind}."
        if not isinstance(block, dict):
            raise ProfileError(f"{origin}: field '{where[:-1]}' must be an object, got {block!r}")
        f.known_keys(block, ("num_requests", "draft_tokens", "context_tokens", "key_padding", "latency_s"), where,
                     origin)
        reqs = f.axis(f.get(block, "num_requests", where, origin), where + "num_requests", origin)
        gammas = f.axis(f.get(block, "draft_tokens", where, origin), where + "draft_tokens", origin)
        shape: tuple[int, ...] = (reqs.size, gammas.size)
        contexts = None
        if block.get("context_tokens") is not None:
            _needs_v2(version, True, where + "context_tokens", origin)
            contexts = f.axis(block["context_tokens"], where + "context_tokens", origin, allow_zero=True)
            shape = (contexts.size, *shape)
        latency = f.grid(f.get(block, "latency_s", where, origin), shape, where + "latency_s", origin)
        padding = "none"
        if "key_padding" in block:
            if contexts is None:
                raise ProfileError(f"{origin}: field '{where}key_padding' needs '{where}context_tokens' (the padding "
                                   "says which context of the batch the table is read at)")
            padding = f.choice(block["key_padding"], KEY_PADDING, where + "key_padding", origin)
        drafts[kind] = DraftTable(reqs, gammas, latency, kind, contexts, origin, padding)
    return drafts


def _table2d(block: dict[str, Any], keys: tuple[str, str, str], where: str, what: str, origin: str) -> Table2D:
    """A two-axis table: ``keys`` = (first axis, second axis, values [first][second])."""
    x_key, y_key, v_key = keys
    x = f.axis(f.get(block, x_key, where, origin), where + x_key, origin, allow_zero=True)
    y = f.axis(f.get(block, y_key, where, origin), where + y_key, origin)
    grid = f.grid(f.get(block, v_key, where, origin), (x.size, y.size), where + v_key, origin, allow_zero=True)
    return Table2D(x, y, grid, what, x_key, y_key, origin)


def _attention(data: dict[str, Any], origin: str) -> tuple[Table2D | None, str]:
    block = f.block(data, "attention", origin, required=False)
    if block is None:
        return None, "none"
    f.known_keys(block, ("context_tokens", "query_tokens", "per_request_s", "key_padding"), "attention.", origin)
    table = _table2d(block, ("context_tokens", "query_tokens", "per_request_s"), "attention.",
                     "attention per_request_s", origin)
    return table, f.choice(block.get("key_padding", "none"), KEY_PADDING, "attention.key_padding", origin)


def _cuda_graphs(data: dict[str, Any], verify: Table1D, origin: str) -> CudaGraphs | None:
    block = f.block(data, "cuda_graphs", origin, required=False)
    if block is None:
        return None
    f.known_keys(block, ("max_captured_tokens", "eager_overhead_s", "eager"), "cuda_graphs.", origin)
    cap = f.integer(f.get(block, "max_captured_tokens", "cuda_graphs.", origin), "cuda_graphs.max_captured_tokens",
                    origin)
    if cap > verify.x[-1]:
        raise ProfileError(f"{origin}: field 'cuda_graphs.max_captured_tokens' is {cap}, beyond the verify table "
                           f"(it ends at {verify.x[-1]:g} batch tokens)")
    if ("eager_overhead_s" in block) == ("eager" in block):
        raise ProfileError(f"{origin}: field 'cuda_graphs' needs exactly one of 'eager_overhead_s' (seconds added "
                           "above the cliff) and 'eager' (an SPS table of eager steps)")
    if "eager_overhead_s" in block:
        return CudaGraphs(cap, f.number(block["eager_overhead_s"], "cuda_graphs.eager_overhead_s", origin, True))
    eager = block["eager"]
    if not isinstance(eager, dict):
        raise ProfileError(f"{origin}: field 'cuda_graphs.eager' must be an object, got {eager!r}")
    f.known_keys(eager, ("batch_tokens", "steps_per_s"), "cuda_graphs.eager.", origin)
    tokens = f.axis(f.get(eager, "batch_tokens", "cuda_graphs.eager.", origin), "cuda_graphs.eager.batch_tokens",
                    origin)
    if tokens[0] > cap + 1:
        raise ProfileError(f"{origin}: field 'cuda_graphs.eager.batch_tokens' starts at {tokens[0]:g}; it must "
                           f"start at or below max_captured_tokens + 1 = {cap + 1}")
    sps = f.values(f.get(eager, "steps_per_s", "cuda_graphs.eager.", origin), tokens.size,
                   "cuda_graphs.eager.steps_per_s", origin)
    return CudaGraphs(cap, eager_sps=Table1D(tokens, sps, "eager SPS over batch_tokens", origin))


def _prefill_table(prefill: dict[str, Any], version: int, origin: str) -> Table1D | None:
    """``prefill.table``: seconds of one prefill over prompt tokens, measured (version 2)."""
    table = prefill.get("table")
    if table is None:
        return None
    _needs_v2(version, True, "prefill.table", origin)
    if not isinstance(table, dict):
        raise ProfileError(f"{origin}: field 'prefill.table' must be an object, got {table!r}")
    where = "prefill.table."
    f.known_keys(table, ("prompt_tokens", "latency_s"), where, origin)
    tokens = f.axis(f.get(table, "prompt_tokens", where, origin), where + "prompt_tokens", origin)
    latency = f.values(f.get(table, "latency_s", where, origin), tokens.size, where + "latency_s", origin)
    return Table1D(tokens, latency, "prefill.table latency_s over prompt_tokens", origin)


def _prefill(data: dict[str, Any], version: int, origin: str) -> tuple[float, float, Table2D | None, Table1D | None]:
    prefill = f.block(data, "prefill", origin)
    f.known_keys(prefill, ("fixed_s", "tokens_per_s", "table", "chunk_attention", "mixed_step", "draft_share",
                           "decode_tail_s"), "prefill.", origin)
    fixed_s = f.number(f.get(prefill, "fixed_s", "prefill.", origin), "prefill.fixed_s", origin, True)
    tokens_per_s = f.number(f.get(prefill, "tokens_per_s", "prefill.", origin), "prefill.tokens_per_s", origin)
    table = _prefill_table(prefill, version, origin)
    chunk = prefill.get("chunk_attention")
    if chunk is None:
        return fixed_s, tokens_per_s, None, table
    _needs_v2(version, True, "prefill.chunk_attention", origin)
    if not isinstance(chunk, dict):
        raise ProfileError(f"{origin}: field 'prefill.chunk_attention' must be an object, got {chunk!r}")
    f.known_keys(chunk, ("context_tokens", "chunk_tokens", "per_chunk_s", "draft_s"), "prefill.chunk_attention.",
                 origin)
    chunk_table = _table2d(chunk, ("context_tokens", "chunk_tokens", "per_chunk_s"), "prefill.chunk_attention.",
                           "prefill chunk_attention per_chunk_s", origin)
    return fixed_s, tokens_per_s, chunk_table, table


def _chunk_draft(data: dict[str, Any], chunk_table: Table2D | None, origin: str) -> Table2D | None:
    """``prefill.chunk_attention.draft_s`` (optional, on the chunk table's axes): the part of each ``per_chunk_s``
    that is the drafter's context build over the chunk, which a policy that drafts nothing does not pay."""
    chunk = data["prefill"].get("chunk_attention")
    if chunk_table is None or "draft_s" not in chunk:
        return None
    where = "prefill.chunk_attention.draft_s"
    grid = f.grid(chunk["draft_s"], chunk_table.values.shape, where, origin, allow_zero=True)
    over = np.argwhere(grid > chunk_table.values)
    if over.size:
        i, j = over[0]
        raise ProfileError(f"{origin}: field '{where}[{i}][{j}]' is {grid[i, j]}, more than the chunk's whole "
                           f"per_chunk_s {chunk_table.values[i, j]} (context_tokens {int(chunk_table.x[i])}, "
                           f"chunk_tokens {int(chunk_table.y[j])}); the drafter's part must be at most the whole")
    return Table2D(chunk_table.x, chunk_table.y, grid, "prefill chunk_attention draft_s", "context_tokens",
                   "chunk_tokens", origin)


def _mixed_step(data: dict[str, Any], version: int, origin: str) -> tuple[float, float] | None:
    """``prefill.mixed_step`` (version 2): ``(fixed_s, per_request_s)`` of a step with chunks and decoding requests."""
    block = data["prefill"].get("mixed_step")
    if block is None:
        return None
    _needs_v2(version, True, "prefill.mixed_step", origin)
    where = "prefill.mixed_step."
    if not isinstance(block, dict):
        raise ProfileError(f"{origin}: field 'prefill.mixed_step' must be {{fixed_s, per_request_s}}, got {block!r}")
    f.known_keys(block, ("fixed_s", "per_request_s"), where, origin)
    return (f.number(f.get(block, "fixed_s", where, origin), where + "fixed_s", origin, True),
            f.number(f.get(block, "per_request_s", where, origin), where + "per_request_s", origin, True))


def _draft_share(data: dict[str, Any], origin: str) -> float:
    """``prefill.draft_share`` (any version; 0 when absent): the share of a disaggregated prefill's seconds that is
    the drafter's pass over the prompt, which a policy that drafts nothing does not pay; in [0, 1)."""
    share = data["prefill"].get("draft_share", 0.0)
    share = f.number(share, "prefill.draft_share", origin, allow_zero=True)
    if share >= 1:
        raise ProfileError(f"{origin}: field 'prefill.draft_share' must be < 1 (a share of the prefill's seconds), "
                           f"got {share}")
    return share


def _decode_tail(data: dict[str, Any], version: int, origin: str) -> tuple[float, ...]:
    """``prefill.decode_tail_s`` (version 2; empty when absent): seconds per prompt prefilled on the decode device
    that the first, second, ... decode step after it pays (1 to ``MAX_DECODE_TAIL_STEPS`` values, each >= 0)."""
    tail = data["prefill"].get("decode_tail_s")
    if tail is None:
        return ()
    _needs_v2(version, True, "prefill.decode_tail_s", origin)
    where = "prefill.decode_tail_s"
    if not isinstance(tail, list) or not 1 <= len(tail) <= MAX_DECODE_TAIL_STEPS:
        raise ProfileError(f"{origin}: field '{where}' must be a list of 1 to {MAX_DECODE_TAIL_STEPS} seconds "
                           f"(one per decode step after a prefill), got {tail!r}")
    return tuple(float(v) for v in f.values(tail, len(tail), where, origin, True))


POLICY_ENTRY = "{fixed_s, per_candidate_s} or {num_candidates, s}"


PolicyDecision = tuple[float, float] | Table1D  # (fixed_s, per_candidate_s), or seconds over candidates


def _policy_decision(entry: Any, where: str, origin: str) -> PolicyDecision:
    """One ``scheduler.policies.<name>`` entry: a line in the candidates, or a table over them."""
    if not isinstance(entry, dict):
        raise ProfileError(f"{origin}: field '{where[:-1]}' must be {POLICY_ENTRY}, got {entry!r}")
    if "num_candidates" in entry or "s" in entry:
        f.known_keys(entry, ("num_candidates", "s"), where, origin)
        candidates = f.axis(f.get(entry, "num_candidates", where, origin), where + "num_candidates", origin)
        seconds = f.values(f.get(entry, "s", where, origin), candidates.size, where + "s", origin, True)
        return Table1D(candidates, seconds, f"{where}s over num_candidates", origin)
    f.known_keys(entry, ("fixed_s", "per_candidate_s"), where, origin)
    return (f.number(f.get(entry, "fixed_s", where, origin), where + "fixed_s", origin, True),
            f.number(f.get(entry, "per_candidate_s", where, origin), where + "per_candidate_s", origin, True))


def _scheduler(data: dict[str, Any], origin: str) -> tuple[float, float, bool, dict[str, PolicyDecision]]:
    sched = f.block(data, "scheduler", origin)
    f.known_keys(sched, ("fixed_s", "per_candidate_s", "inline", "policies"), "scheduler.", origin)
    fixed_s = f.number(f.get(sched, "fixed_s", "scheduler.", origin), "scheduler.fixed_s", origin, True)
    per_candidate_s = f.number(f.get(sched, "per_candidate_s", "scheduler.", origin), "scheduler.per_candidate_s",
                               origin, True)
    inline = f.flag(sched.get("inline", False), "scheduler.inline", origin)
    block = sched.get("policies", {})
    if not isinstance(block, dict):
        raise ProfileError(f"{origin}: field 'scheduler.policies' must map policy names to {POLICY_ENTRY}, "
                           f"got {block!r}")
    by_policy = {name: _policy_decision(entry, f"scheduler.policies.{name}.", origin) for name, entry in block.items()}
    return fixed_s, per_candidate_s, inline, by_policy


def _token_budget(data: dict[str, Any], max_batch_tokens: int, origin: str) -> int | None:
    block = f.block(data, "token_budget", origin, required=False)
    if block is None:
        return None
    f.known_keys(block, ("max_num_batched_tokens",), "token_budget.", origin)
    budget = f.integer(f.get(block, "max_num_batched_tokens", "token_budget.", origin),
                       "token_budget.max_num_batched_tokens", origin)
    if budget > max_batch_tokens:
        raise ProfileError(f"{origin}: field 'token_budget.max_num_batched_tokens' is {budget}, but the dense cost "
                           f"covers only {max_batch_tokens} batch tokens")
    return budget


def profile_from_dict(data: dict[str, Any], origin: str = "<memory>") -> HardwareProfile:
    """Validate a profile dictionary (version 1 or 2); errors name ``origin`` and the field."""
    version = _header(data, origin)
    meta = _metadata(data, origin)
    gpus = f.integer(f.get(data, "gpus_per_replica", "", origin), "gpus_per_replica", origin)
    verify_sps, dense_step_s, padded_slot_s = _verify(data, version, origin)
    per_request = _per_request(data, origin)
    drafts = _drafts(data, version, origin)
    prefill_fixed_s, prefill_tokens_per_s, chunk_attention, prefill_table = _prefill(data, version, origin)
    chunk_draft = _chunk_draft(data, chunk_attention, origin)
    sched_fixed_s, sched_per_candidate_s, inline, by_policy = _scheduler(data, origin)
    attention, key_padding = _attention(data, origin)
    graphs = _cuda_graphs(data, verify_sps, origin)
    dense_end = graphs.eager_sps.x[-1] if graphs is not None and graphs.eager_sps is not None else verify_sps.x[-1]
    return HardwareProfile(
        metadata=meta, gpus_per_replica=gpus, verify_sps=verify_sps, per_request_s=per_request, draft=drafts,
        prefill_fixed_s=prefill_fixed_s, prefill_tokens_per_s=prefill_tokens_per_s,
        scheduler_fixed_s=sched_fixed_s, scheduler_per_candidate_s=sched_per_candidate_s,
        padded_slot_s=padded_slot_s, scheduler_inline=inline, scheduler_by_policy=by_policy, raw=data, path=origin,
        version=version, dense_step_s=dense_step_s, attention=attention, key_padding=key_padding,  # type: ignore[arg-type]
        cuda_graphs=graphs, max_num_batched_tokens=_token_budget(data, int(dense_end), origin),
        chunk_attention=chunk_attention, prefill_table=prefill_table, mixed_step=_mixed_step(data, version, origin),
        prefill_draft_share=_draft_share(data, origin), chunk_draft=chunk_draft,
        decode_tail_s=_decode_tail(data, version, origin),
        decode_token_s=_verify_seconds(data["verify"], "decode_token_s", version, origin),
        draft_token_s=_verify_seconds(data["verify"], "draft_token_s", version, origin),
        join_s=_verify_seconds(data["verify"], "join_s", version, origin),
        leave_s=_verify_seconds(data["verify"], "leave_s", version, origin),
        wake_s=_verify_seconds(data["verify"], "wake_s", version, origin))
