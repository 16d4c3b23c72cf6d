"""Plant classic speculative-decoding bugs one at a time and see whether the losslessness tests kill them.

    python -m tests.mutants                      # every mutant, then a table
    python -m tests.mutants --list               # what each mutant plants
    python -m tests.mutants merge_on_wrong_key   # some of them

Each mutant is a small source patch (file, exact text, replacement) applied to a
copy of the working tree in a temporary folder; the tree itself is never
written. The losslessness tests (``tests/test_lossless*.py``, without the slow
ones, stopping at the first failure) then run in the copy. A mutant is
*killed* when a test fails, *survives* when all pass, and is *not planted* when
its text is no longer in the source (the code moved on: update the mutant).
The unmutated copy runs first and must pass. The exit status is 0 only when
every mutant was planted and killed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# cheap, targeted files first: with -x most mutants die in seconds
TEST_FILES = ("tests/test_lossless_pieces.py", "tests/test_lossless_checks.py",
              "tests/test_lossless_counterexamples.py", "tests/test_lossless_docs.py",
              "tests/test_lossless_montecarlo.py", "tests/test_lossless.py")
TIMEOUT_S = 1800


@dataclass(frozen=True)
class Patch:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    patches: tuple[Patch, ...]


SAMPLER, EXACT = "policies/lossless/sampler.py", "policies/lossless/exact.py"
MUTANTS = (
    Mutant("wrong_acceptance_ratio", "accept x with min(1, q(x)/p(x)) instead of min(1, p(x)/q(x))", (
        Patch(SAMPLER, "np.divide(np.minimum(p, q), q, out=np.ones(np.broadcast_shapes(p.shape, q.shape)), "
                       "where=q > 0.0)",
              "np.divide(np.minimum(p, q), p, out=np.ones(np.broadcast_shapes(p.shape, q.shape)), where=p > 0.0)"),
    )),
    Mutant("unnormalised_residual", "the correction drawn from max(0, p - q) without dividing by its mass", (
        Patch(SAMPLER, "return np.where(total > 0.0, excess / np.where(total > 0.0, total, 1.0), p)",
              "return np.where(total > 0.0, excess, p)"),
    )),
    Mutant("residual_wrong_way", "the correction drawn from norm(max(0, q - p))", (
        Patch(SAMPLER, "excess = np.maximum(0.0, p - np.asarray(q, dtype=np.float64))",
              "excess = np.maximum(0.0, np.asarray(q, dtype=np.float64) - p)"),
    )),
    Mutant("bonus_from_draft", "the bonus token drawn from the last draft distribution (sampler and checker)", (
        Patch(SAMPLER, "(sample_token(target_probs[length], rng),)",
              "(sample_token(draft_probs[length - 1] if length else target_probs[0], rng),)"),
        Patch(EXACT, "bonus = target_probs[len(draft_tokens)]",
              "bonus = draft_probs[len(draft_tokens) - 1] if len(draft_tokens) else target_probs[0]"),
    )),
    Mutant("bonus_from_draft_sampler", "the same bug in the sampler only (the checker stays right)", (
        Patch(SAMPLER, "(sample_token(target_probs[length], rng),)",
              "(sample_token(draft_probs[length - 1] if length else target_probs[0], rng),)"),
    )),
    Mutant("deeper_first_ties", "survival ties admitted deeper position first (top-K lengths)", (
        Patch("policies/base.py", "ties = np.flatnonzero(flat == kth)[: k - np.count_nonzero(admitted)]",
              "ties = np.flatnonzero(flat == kth)[::-1][: k - np.count_nonzero(admitted)]"),
    )),
    Mutant("stale_pool_off_by_one", "dspark staleness 2 sizes K from the 1-step-old pool (history[-1])", (
        Patch("policies/dspark.py", "view.history[-self.staleness_steps]", "view.history[-1]"),
    )),
    Mutant("stale_pool_one_fresher", "dspark reads the pool one step fresher: staleness 1 sizes K on the current one", (
        Patch("policies/dspark.py", "view.history[-self.staleness_steps]",
              "(view.history + (survival,))[-self.staleness_steps]"),
    )),
    Mutant("no_early_stop", "greedy takes the best prefix of the whole path (global_sync) instead of stopping", (
        Patch("policies/greedy.py", "count = early_stop_count(", "count = best_prefix_count("),
    )),
    Mutant("merge_on_wrong_key", "the exact checker merges branches whose policy memories differ", (
        Patch(EXACT, "return tuple(run.request_key(r, out) for r, out in enumerate(outputs)), memory_key",
              "return tuple(run.request_key(r, out) for r, out in enumerate(outputs))"),
    )),
    Mutant("decisions_cached_without_memory", "the exact checker reuses a decision taken under another memory", (
        Patch(EXACT, "key = (ids, confidence.tobytes(), memory_key)", "key = (ids, confidence.tobytes())"),
    )),
    Mutant("merge_without_context", "the exact checker merges branches whose model contexts differ", (
        Patch(EXACT, "return out[:self.num_tokens], self.context(tuple(self.prompts[request]) + out)",
              "return out[:self.num_tokens]"),
    )),
)


def tree_files(root: Path) -> list[str]:
    """Tracked and untracked, not ignored, files of the working tree (what the tests read)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            check=True, capture_output=True).stdout.decode()
    return [name for name in listed.split("\0") if name and (root / name).is_file()]


def copy_tree(root: Path, target: Path) -> None:
    for name in tree_files(root):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target / name)


def run_tests(copy: Path) -> tuple[str, str, float]:
    """(passed | failed | error, first failing test or the tail of the output, seconds) of the lossless tests."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *TEST_FILES]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "error", f"timed out after {TIMEOUT_S} s", time.monotonic() - started
    seconds = time.monotonic() - started
    if done.returncode == 0:
        return "passed", "", seconds
    failed = [line.split(" ", 1)[1].split(" - ")[0] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    if done.returncode == 1 and failed:
        return "failed", failed[0], seconds
    tail = (done.stdout + done.stderr).strip().splitlines()
    return "error", tail[-1] if tail else f"exit status {done.returncode}", seconds


def plant(copy: Path, mutant: Mutant) -> dict[Path, str] | None:
    """Apply the mutant's patches; return the original texts to restore, or None when a text is not found once."""
    originals: dict[Path, str] = {}
    for patch in mutant.patches:
        path = copy / patch.path
        text = originals.get(path, path.read_text())
        originals.setdefault(path, text)
        current = path.read_text()
        if current.count(patch.old) != 1:
            for restored, original in originals.items():
                restored.write_text(original)
            return None
        path.write_text(current.replace(patch.old, patch.new))
    return originals


def check_imports_from_copy(copy: Path) -> None:
    """The copy must import its own packages (the editable install points at the tree)."""
    found = subprocess.run([sys.executable, "-c", "import policies; print(policies.__file__)"], cwd=copy,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not Path(found).resolve().is_relative_to(copy.resolve()):
        raise RuntimeError(f"the copy imports policies from {found}, not from itself")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    if args.list:
        for mutant in MUTANTS:
            print(f"{mutant.name:<32} {mutant.what}")
        return 0
    unknown = sorted(set(args.names) - {m.name for m in MUTANTS})
    if unknown:
        parser.error(f"unknown mutants: {', '.join(unknown)}")
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    with tempfile.TemporaryDirectory(prefix="specsched-mutants-") as folder:
        copy = Path(folder)
        copy_tree(ROOT, copy)
        check_imports_from_copy(copy)
        status, detail, seconds = run_tests(copy)
        print(f"unmutated tree: {status} in {seconds:.0f} s {detail}", flush=True)
        if status != "passed":
            print("the losslessness tests must pass on the unmutated tree first", file=sys.stderr)
            return 2
        rows = []
        for mutant in chosen:
            originals = plant(copy, mutant)
            if originals is None:
                rows.append((mutant.name, "NOT PLANTED", "its source text is gone: update the mutant", 0.0))
            else:
                try:
                    status, detail, seconds = run_tests(copy)
                finally:
                    for path, text in originals.items():
                        path.write_text(text)
                verdict = {"failed": "killed", "passed": "SURVIVED", "error": "ERROR"}[status]
                rows.append((mutant.name, verdict, detail, seconds))
            print(f"{rows[-1][0]:<32} {rows[-1][1]:<12} {rows[-1][3]:5.0f} s  {rows[-1][2]}", flush=True)
    names = max(len(row[0]) for row in rows)
    width = max(len("killed by (first failing test)"), *(len(row[2]) for row in rows))
    print()
    print(f"| {'mutant':<{names}} | {'result':<11} | {'killed by (first failing test)':<{width}} |")
    print(f"|{'-' * (names + 2)}|{'-' * 13}|{'-' * (width + 2)}|")
    for name, verdict, detail, _ in rows:
        print(f"| {name:<{names}} | {verdict:<11} | {detail:<{width}} |")
    return 0 if all(row[1] == "killed" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
