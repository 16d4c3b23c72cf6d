"""How closely the simulator's in-order replay of a dense acceptance log follows real speculative decoding.

``python -m calibration.validation.replay_check [--models trained] [--draft 7] [--requests 256] [--tokens 64]``

``calibration.validate`` records a *dense* log (one kept token per step, so a verified block at every output
position) and the simulator walks it (:class:`simulator.acceptance.replay.LoggedAcceptance`, ``order="walk"``). A
walk is exact at every position it visits, but it moves through the logged text, not through the text the policy
would have written: after a rejection a real decoder goes on from the token it sampled in its place, while the walk
goes on from the logged token at that position, which the logged decoder kept for other reasons. This command
measures what that costs, per domain, for the static policy ``mtp<k>`` (every draft token verified):

1. the validation's prompts (its prompt source, lengths and seeds: :func:`~calibration.validation.setup.record_log`)
   are decoded as the serving loop decodes them (each step keeps the accepted tokens and one from the target);
2. the same prompts are decoded densely, as the validation records its log;
3. the dense log is walked by the simulator's replay, one request per logged request, for the same number of
   output tokens.

The two decodings sample their own continuations of the same prompts, so each request's pair differs by its text
as well as by the replay; the table gives the mean tokens per step of each, the replay's relative error and its
standard error over the requests (paired by prompt). Only the acceptance is compared: no timing, no machine noise.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from calibration.validation.setup import ValidationConfig, build_models, record_log
from simulator.acceptance.replay import LoggedAcceptance
from traces.workload import DOMAINS


def steps_to(log: pd.DataFrame, num_tokens: int) -> pd.Series:
    """Steps each logged request took to decode ``num_tokens`` output tokens (a log of whole steps: every block
    that started before that position), indexed by (domain, request_id)."""
    blocks = log.loc[log["decoded_tokens"] < num_tokens, ["domain", "request_id", "step"]].drop_duplicates()
    return blocks.groupby(["domain", "request_id"]).size()


def replayed_steps(log: pd.DataFrame, num_draft: int, num_tokens: int, dense: bool = True) -> pd.Series:
    """Steps the simulator's replay takes to walk each logged request to ``num_tokens`` output tokens under
    ``mtp<num_draft>``, indexed by (domain, request_id); all requests advance together (one array operation per
    step). ``dense``: the log must have a block at every output position (else the walk takes the last block at
    or before each position, which retraces a log recorded by ``mtp<num_draft>`` itself step for step)."""
    replay = LoggedAcceptance(log, order="auto" if dense else "walk")
    if replay.order != "walk":
        raise ValueError("replayed_steps needs a dense log (a block at every output position)")
    keys = log[["domain", "request_id"]].drop_duplicates()
    keys = keys.assign(rank=keys["domain"].map(DOMAINS.index)).sort_values(["rank", "request_id"])
    domain_idx = keys["rank"].to_numpy(dtype=np.int64)
    within = keys.groupby("rank").cumcount().to_numpy()
    # logged request i of its domain (the replay's order: request_id within each domain)
    difficulty = (within + 0.5) / replay.requests_per_domain[domain_idx]
    decoded = np.zeros(len(keys), dtype=np.int64)
    steps = np.zeros(len(keys), dtype=np.int64)
    rng = np.random.default_rng(0)  # unused by a walk; the interface takes one
    while (active := decoded < num_tokens).any():
        _, accepted = replay.sample_step(rng, domain_idx[active], difficulty[active], num_draft, decoded[active])
        decoded[active] += accepted + 1
        steps[active] += 1
    return pd.Series(steps, index=pd.MultiIndex.from_frame(keys[["domain", "request_id"]]))


def compare(real: pd.Series, replayed: pd.Series, num_tokens: int) -> pd.DataFrame:
    """Per domain (and all together): requests, mean tokens per step of the real decoding and of the replay, the
    replay's relative error and its standard error (paired per request: the same prompt on both sides)."""
    both = pd.DataFrame({"real": num_tokens / real, "replay": num_tokens / replayed}).dropna()
    rows = []
    for name, part in [*both.groupby(level="domain"), ("all", both)]:
        diff = part["replay"] - part["real"]
        mean_real = float(part["real"].mean())
        rows.append({"domain": name, "requests": len(part), "real_tokens_per_step": mean_real,
                     "replay_tokens_per_step": float(part["replay"].mean()),
                     "replay_err": float(diff.mean()) / mean_real,
                     "replay_err_se": float(diff.std(ddof=1)) / np.sqrt(len(part)) / mean_real})
    return pd.DataFrame(rows)


def replay_check(cfg: ValidationConfig, num_draft: int, num_tokens: int) -> pd.DataFrame:
    """The comparison for ``cfg``'s models and traffic (``cfg.log_requests`` prompts per domain)."""
    torch.set_num_threads(cfg.threads)
    models = build_models(cfg)
    real = record_log(cfg, models, num_draft, num_tokens, max_kept_tokens=None)
    dense = record_log(cfg, models, num_draft, num_tokens, max_kept_tokens=1)
    return compare(steps_to(real, num_tokens), replayed_steps(dense, num_draft, num_tokens), num_tokens)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    d = ValidationConfig()
    p = argparse.ArgumentParser(prog="python -m calibration.validation.replay_check",
                                description=__doc__.split("\n")[0])
    p.add_argument("--models", default="trained", choices=("auto", "trained", "random"))
    p.add_argument("--drafter", default=d.drafter)
    p.add_argument("--draft", type=int, default=d.gamma, help="draft tokens per step (policy mtp<k>)")
    p.add_argument("--requests", type=int, default=256, help="prompts per domain")
    p.add_argument("--tokens", type=int, default=d.output_tokens, help="output tokens decoded per request")
    p.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--out", help="also write the table to this CSV file")
    args = p.parse_args(argv)
    for name in ("draft", "requests", "tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    try:
        cfg = replace(d, models=args.models, drafter=args.drafter, gamma=args.draft, log_requests=args.requests,
                      prompt_tokens=args.prompt_tokens, output_tokens=args.tokens, seed=args.seed,
                      threads=args.threads)
    except ValueError as err:  # the validation's own checks (prompt tokens, drafter, ...), as one line
        p.error(str(err))
    table = replay_check(cfg, args.draft, args.tokens)
    print(f"in-order replay of a dense log against real decoding: mtp{args.draft}, {args.models} models, "
          f"{args.requests} prompts per domain, {args.tokens} output tokens, seed {args.seed}")
    shown = table.assign(replay_err=table["replay_err"].map("{:+.1%}".format),
                         replay_err_se=table["replay_err_se"].map("{:.1%}".format))
    print(shown.to_string(index=False, float_format="{:.3f}".format))
    if args.out:
        table.to_csv(args.out, index=False)
    return table


if __name__ == "__main__":
    main()
