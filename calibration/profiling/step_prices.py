"""The real loop's steps priced by the profile: the cost model's error alone, apart from scheduling and acceptance.

A point's throughput error mixes two things: what a step costs (the profile against
the loop's measured step times) and which steps run (batch sizes, verification
lengths and acceptance, which the simulator reproduces only in distribution).
:func:`step_cost_ratio` takes the real loop's own steps - their batch sizes,
verification lengths (the longest one for query padding), contexts and, in chunked
runs, their prefill chunks (the chunks table,
:data:`calibration.serving.spec.CHUNK_COLUMNS`) - prices each as the simulator's
engine would (drafter, inline decision, verifier forward with padding and per-request
work, attention at the contexts, chunk attention at the chunks' computed-before
contexts) and compares the sum with the measured cycles (end of the previous step to
the end of this one, less any sleep for a prefill). A ratio above 1: the loop's steps
cost more than the profile says, and the simulator is optimistic by about that much
whatever the acceptance.

``python -m calibration.profiling.step_prices OUT_DIR [--kept-only]`` reads a
validation's output folder (its settings from ``config.json``) and prints, per policy
and users, that ratio over all steps, over the steps with prefill chunks and over the
others, with the drafter's share (:func:`breakdown`).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from policies import make_policy
from simulator.costs import HardwareProfile, load_profile
from simulator.costs.schema import MAX_DECODE_TAIL_STEPS
from simulator.costs.step_cost import decision_s, target_cost

PARTS = ("draft_s", "sched_s", "verify_s")  # what price_parts gives each step; their sum is the step's price
# [MAX_DECODE_TAIL_STEPS] priced_cycles' columns: prompts prefilled on the decode device (their time cut from the
# decode clock, the loop's num_cut_prefills) before the step itself (k = 0) and before each of the k steps before it
RECENT_PREFILLS = tuple(f"cut_prefills_{k}_back" for k in range(MAX_DECODE_TAIL_STEPS))
_NO_CHUNKS = (np.zeros(0), np.zeros(0, dtype=np.int64))


def _chunks_by_step(steps: pd.DataFrame, chunks: pd.DataFrame | None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Step label -> (chunk contexts [P], chunk tokens [P]), checked against the steps' prefill columns."""
    if "prefill_tokens" not in steps:
        return {}  # a steps table without prefill columns (disaggregated): no step has chunks
    want = steps["prefill_tokens"].to_numpy(int)
    if chunks is None:
        if (want > 0).any():
            raise ValueError(f"{int((want > 0).sum())} steps have prefill chunks (prefill_tokens > 0) but no chunks "
                             f"table was given (the run's chunks, columns step, context_tokens, chunk_tokens)")
        return {}
    found = {int(step): (group["context_tokens"].to_numpy(float), group["chunk_tokens"].to_numpy(int))
             for step, group in chunks.groupby("step", sort=False)}
    for label, tokens, count in zip(steps.index, want, steps["num_prefill_requests"].to_numpy(int), strict=True):
        sizes = found.get(int(label), _NO_CHUNKS)[1]
        if int(sizes.sum()) != tokens or sizes.size != count:
            raise ValueError(f"step {label}: the chunks table has {sizes.size} chunks of {int(sizes.sum())} tokens, "
                             f"the steps table says {count} of {tokens} (num_prefill_requests, prefill_tokens)")
    return found


def batch_contexts(num_requests: int, context_tokens: float, max_context_tokens: float) -> np.ndarray:
    """Contexts [R] with a logged step's total and longest context (the rest shared evenly): what a drafter's table
    read at the batch's mean, or its longest with key padding, reads at."""
    rest = np.full(num_requests - 1, (context_tokens - max_context_tokens) / max(num_requests - 1, 1))
    return np.append(max_context_tokens, rest)


def price_parts(steps: pd.DataFrame, profile: HardwareProfile, drafter: str, policy: str, draft_tokens: int,
                synchronous: bool = False, chunks: pd.DataFrame | None = None) -> pd.DataFrame:
    """The profile's drafter, decision and target seconds (:data:`PARTS`) of each step of a real steps table
    (columns of :data:`calibration.serving.spec.STEP_COLUMNS`, indexed by step number), as
    :class:`simulator.costs.StepPricer` prices a step of the same requests and chunks:

    * drafter and decision (decoding requests only; none in a step of chunks alone), the drafter read at the
      batch's mean context, or its longest when the drafter's table pads keys;
    * the target's forward over decode plus chunk tokens (:func:`simulator.costs.step_cost.target_cost`, the
      engine's own arithmetic): dense part, query padding to 1 + ``max_verified_tokens``, per-request work of R +
      chunks, the host work per decode token on ``batch_tokens`` alone, each decoding request's attention with
      ``batch_tokens / num_requests`` query tokens (the log keeps the sum of the verification lengths, not each
      one: exact when they are equal) over the mean context, or the longest with key padding, and each chunk's
      attention over its computed-before context (``chunks``: the run's chunks table, whose ``step`` are labels of
      ``steps``'s index; needed when a step has prefill tokens);
    * the work for the requests that joined the batch before the step and those it finished (``verify.join_s``,
      ``verify.leave_s``) and for waking after a sleep (``verify.wake_s``, a step with ``wait_s`` > 0), in the
      target's part, from the columns ``num_joined`` and ``num_left`` where the table has them;
    * the tail of the prompts prefilled on the decode device before it (``prefill.decode_tail_s``), in the
      target's part, from the columns :data:`RECENT_PREFILLS` (:func:`priced_cycles`) where the table has them.
    Steps logged before the loop counted joins or prefills cut from its clock get none of that work.
    """
    by_step = _chunks_by_step(steps, chunks)
    out = np.zeros((len(steps), len(PARTS)))
    if "num_joined" in steps:  # the engine's churn work
        out[:, 2] = [profile.churn_s(j, n, w > 0) for j, n, w in zip(steps["num_joined"], steps["num_left"],
                                                                     steps["wait_s"], strict=True)]
    if profile.decode_tail_s and RECENT_PREFILLS[0] in steps:
        out[:, 2] += recent_prefills(steps, len(profile.decode_tail_s)) @ np.array(profile.decode_tail_s)
    for i, (label, r, b, longest, ctx, max_ctx) in enumerate(zip(
            steps.index, steps["num_requests"].to_numpy(int), steps["batch_tokens"].to_numpy(int),
            steps["max_verified_tokens"].to_numpy(int), steps["context_tokens"].to_numpy(float),
            steps["max_context_tokens"].to_numpy(float), strict=True)):
        chunk_contexts, chunk_tokens = by_step.get(int(label), _NO_CHUNKS)
        attention_s = 0.0
        if r:
            if draft_tokens:
                out[i, 0] = profile.draft_s(drafter, r, draft_tokens,
                                            profile.draft_context(drafter, batch_contexts(r, ctx, max_ctx)))
            out[i, 1] = decision_s(profile, policy, synchronous, r, draft_tokens)
            if profile.attention is not None:
                mean = np.full(r, max_ctx if profile.key_padding == "longest" else ctx / r)
                attention_s = profile.attention_s(mean, np.full(r, max(1, round(b / r))))
        out[i, 2] += target_cost(profile, r, b, longest, attention_s, chunk_contexts, chunk_tokens,
                                 drafting=draft_tokens > 0).verify_s
    return pd.DataFrame(out, index=steps.index, columns=list(PARTS))


def recent_prefills(steps: pd.DataFrame, num_steps: int) -> np.ndarray:
    """[steps, num_steps] prompts prefilled on the decode device before each step and before each of the
    ``num_steps`` - 1 steps before it (the columns :func:`priced_cycles` adds)."""
    return steps[list(RECENT_PREFILLS[:num_steps])].to_numpy(float)


def static_attention_s(profile: HardwareProfile, num_requests: int, draft_tokens: int, context_tokens: int,
                       max_context_tokens: int) -> float:
    """A static policy's step's attention by the profile (0 without an attention table): every request verifies
    ``draft_tokens`` over the longest context when keys are padded to it, else over the mean."""
    if profile.attention is None:
        return 0.0
    context = max_context_tokens if profile.key_padding == "longest" else context_tokens / num_requests
    return profile.attention_s(np.full(num_requests, float(context)), 1 + draft_tokens)


def priced_steps_s(steps: pd.DataFrame, profile: HardwareProfile, drafter: str, policy: str, draft_tokens: int,
                   synchronous: bool = False, chunks: pd.DataFrame | None = None) -> np.ndarray:
    """Seconds the profile gives each step of a real steps table (:func:`price_parts`, summed)."""
    return price_parts(steps, profile, drafter, policy, draft_tokens, synchronous, chunks).sum(axis=1).to_numpy()


def priced_cycles(steps: pd.DataFrame, warmup_s: float) -> pd.DataFrame:
    """The steps after ``warmup_s`` that have a measured cycle (a previous step; decoding requests or prefill
    chunks), with it as ``cycle_s``: end of the previous step to the end of this one, less the sleep between; and,
    where ``steps`` (one run's, in order) count the prompts prefilled on the decode device before each
    (``num_cut_prefills``), those before it and before each of the steps just before it (:data:`RECENT_PREFILLS`)."""
    if "num_cut_prefills" in steps:
        cuts, n = steps["num_cut_prefills"].to_numpy(np.int64), len(steps)
        steps = steps.assign(**{name: np.concatenate((np.zeros(min(k, n), np.int64), cuts[:max(n - k, 0)]))
                                for k, name in enumerate(RECENT_PREFILLS)})
    cycle_s = steps["end_at"].diff() - steps["wait_s"]
    work = steps["num_requests"] > 0
    if "prefill_tokens" in steps:
        work |= steps["prefill_tokens"] > 0
    keep = (steps["start_at"] >= warmup_s) & work & cycle_s.notna()
    return steps[keep].assign(cycle_s=cycle_s[keep])


def excess_entry_s(mean_excess_s: Sequence[float]) -> list[float]:
    """A profile's ``scheduler.policies.<name>.s`` from a policy's raw mean excess per probed R: none below 0 (a
    decision takes no negative time)."""
    return [max(float(e), 0.0) for e in mean_excess_s]


def step_cost_ratio(slices: Sequence[pd.DataFrame], profile: HardwareProfile, drafter: str, policy: str,
                    draft_tokens: int, warmup_s: float, synchronous: bool = False,
                    chunks: Sequence[pd.DataFrame] | None = None) -> float:
    """Measured over priced seconds of the steps after ``warmup_s`` of every slice (NaN without any); ``chunks``:
    each slice's chunks table (chunked runs)."""
    measured, priced = 0.0, 0.0
    for k, steps in enumerate(slices):
        kept = priced_cycles(steps, warmup_s)
        if kept.empty:
            continue
        measured += float(kept["cycle_s"].sum())
        priced += float(priced_steps_s(kept, profile, drafter, policy, draft_tokens, synchronous,
                                       None if chunks is None else chunks[k]).sum())
    return measured / priced if priced else float("nan")


def _ratio(real: pd.Series, priced: pd.Series) -> float:
    return float(real.sum() / priced.sum()) if len(real) and priced.sum() else float("nan")


def _priced_slices(path: Path, profile: HardwareProfile, drafter: str, gamma: int, warmup_s: float,
                   slices: set[int] | None) -> pd.DataFrame:
    """The priced steps (:func:`priced_cycles`, with ``price_s`` and ``draft_price_s``) of one point's slices
    (``slices``: only these), from its steps table at ``path`` and the chunks table beside it."""
    policy = make_policy(_point(path)[0])
    table = pd.read_parquet(path)
    chunk_path = path.with_name(path.name.replace("_steps.", "_chunks."))
    chunk_table = pd.read_parquet(chunk_path) if chunk_path.exists() else None
    parts = []
    for k, steps in table.groupby("slice", sort=True):
        if slices is not None and k not in slices:
            continue
        kept = priced_cycles(steps.drop(columns="slice").reset_index(drop=True), warmup_s)
        chunks = None if chunk_table is None else chunk_table[chunk_table["slice"] == k]
        priced = price_parts(kept, profile, drafter, policy.name, policy.draft_tokens(gamma), policy.synchronous,
                             chunks)
        parts.append(kept.assign(price_s=priced.sum(axis=1), draft_price_s=priced["draft_s"], slice=k))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _point(path: Path) -> tuple[str, int]:
    match = re.fullmatch(r"real_(.+)_u(\d+)_steps\.parquet", path.name)
    if match is None:
        raise ValueError(f"{path}: expected a name real_<policy>_u<users>_steps.parquet")
    return match[1], int(match[2])


def breakdown(out_dir: Path, drafter: str, gamma: int, warmup_s: float, kept_only: bool = False) -> pd.DataFrame:
    """Per policy and users of a validation output folder (its ``profile.json`` and ``real_<policy>_u<users>_steps``
    and ``_chunks`` tables; ``kept_only``: only the slices ``slices.csv`` says the point kept, those of the report's
    *real step / priced*): slices, steps priced, steps with chunks (of which chunks alone), mean measured and priced
    cycle, real / priced over all steps, over the steps with chunks and over the others, and the drafter's measured
    and priced mean seconds over the steps with decoding requests. The measured drafter time of a step with chunks
    includes the drafter's context of the chunk tokens, which the profile prices inside the chunk attention."""
    profile = load_profile(out_dir / "profile.json")
    kept = pd.read_csv(out_dir / "slices.csv") if kept_only else None
    rows = []
    for path in sorted(out_dir.glob("real_*_steps.parquet")):
        name, users = _point(path)
        slices = None if kept is None else set(
            kept.loc[(kept["policy"] == name) & (kept["num_users"] == users) & kept["kept"], "slice"].tolist())
        s = _priced_slices(path, profile, drafter, gamma, warmup_s, slices)
        row: dict = {"policy": name, "users": users, "slices": 0 if s.empty else s["slice"].nunique(), "steps": len(s)}
        if not s.empty:
            chunked, decoding = s["prefill_tokens"] > 0, s["num_requests"] > 0
            row.update({"chunk_steps": int(chunked.sum()), "chunk_only_steps": int((chunked & ~decoding).sum()),
                        "real_ms": 1e3 * s["cycle_s"].mean(), "priced_ms": 1e3 * s["price_s"].mean(),
                        "real/priced": _ratio(s["cycle_s"], s["price_s"]),
                        "chunk_steps_real/priced": _ratio(s["cycle_s"][chunked], s["price_s"][chunked]),
                        "other_steps_real/priced": _ratio(s["cycle_s"][~chunked], s["price_s"][~chunked]),
                        "draft_real_ms": 1e3 * s["draft_s"][decoding].mean(),
                        "draft_priced_ms": 1e3 * s["draft_price_s"][decoding].mean()})
        rows.append(row)
    if not rows:
        raise ValueError(f"{out_dir}: no real_<policy>_u<users>_steps.parquet (a validation output folder?)")
    table = pd.DataFrame(rows)
    counts = [name for name in ("chunk_steps", "chunk_only_steps") if name in table]
    table = table.astype(dict.fromkeys(counts, "Int64"))  # counts stay integers beside the NaN of empty points
    return table.sort_values(["policy", "users"], ignore_index=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m calibration.profiling.step_prices",
                                description="The real loop's steps of a validation output folder against their "
                                            "price by its profile, per policy and users.")
    p.add_argument("out_dir", type=Path, help="the folder python -m calibration.validate --out wrote")
    p.add_argument("--drafter", help="the validation's --drafter (default: its config.json's, else dspark)")
    p.add_argument("--gamma", type=int, help="the validation's --gamma (default: its config.json's, else 7)")
    p.add_argument("--warmup-s", type=float, help="each slice's warm-up, left out (default: config.json's, else 0.5)")
    p.add_argument("--kept-only", action="store_true", help="only the slices the validation kept (slices.csv)")
    args = p.parse_args(argv)
    config_path = args.out_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    drafter = args.drafter or config.get("drafter", "dspark")
    gamma = args.gamma if args.gamma is not None else int(config.get("gamma", 7))
    warmup_s = args.warmup_s if args.warmup_s is not None else float(config.get("warmup_s", 0.5))
    table = breakdown(args.out_dir, drafter, gamma, warmup_s, args.kept_only)
    print(f"{args.out_dir}: drafter {drafter}, gamma {gamma}, warm-up {warmup_s:g} s per slice, "
          + ("slices the validation kept" if args.kept_only else "every slice"))
    with pd.option_context("display.width", 250, "display.max_columns", None):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
