"""Offline training and held-out text, one corpus per domain, as 7-bit ASCII byte arrays.

Nothing is downloaded; every corpus is read from this machine or generated:

* ``code`` - Python source of the standard library of the running interpreter
  (``sysconfig.get_paths()['stdlib']``; Python Software Foundation License).
  Tests, IDLE, ``lib2to3``, ``pydoc_data`` and ``site-packages`` are left out.
* ``math`` - arithmetic word problems with worked answers, generated here from
  templates with a seeded ``np.random.Generator`` (no outside text).
* ``chat`` - English prose of the Python documentation topics that ship with the
  interpreter (``pydoc_data.topics``; PSF License). It is reference prose, not
  dialogue: the closest clearly licensed English text available offline.

Documents are split into train and held-out sets by a CRC-32 of their name (one
in ten held out), so the split does not depend on the order files are listed in.
The math domain holds out by seed instead: held-out problems come from another
generator stream. Bytes >= 128 become ``?`` so the vocabulary is 128 symbols.
"""

from __future__ import annotations

import sysconfig
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from calibration.models.presets import VOCAB_SIZE
from traces.workload import DOMAINS

Split = Literal["train", "heldout"]
HELDOUT_EVERY = 10  # one document in ten (by CRC-32 of its name) is held out
_SKIPPED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "__pycache__", "pydoc_data", "lib2to3",
                           "turtledemo", "ensurepip"})
_SEPARATOR = b"\n\n"


@dataclass(frozen=True)
class Corpus:
    """One domain's text of one split: ``tokens [N]`` uint8 in 0..127 and where it came from."""

    domain: str
    split: Split
    tokens: np.ndarray  # [N] uint8
    source: str

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.size)


def encode(text: str | bytes) -> np.ndarray:
    """Text -> [N] uint8 ASCII codes (non-ASCII bytes become ``?``)."""
    raw = np.frombuffer(text.encode("utf-8") if isinstance(text, str) else text, dtype=np.uint8)
    return np.where(raw < VOCAB_SIZE, raw, ord("?")).astype(np.uint8)


def decode(tokens: np.ndarray | list[int]) -> str:
    return bytes(int(t) for t in tokens).decode("ascii", errors="replace")


def _held_out(name: str) -> bool:
    return zlib.crc32(name.encode()) % HELDOUT_EVERY == 0


def _join(documents: list[tuple[str, bytes]], split: Split) -> np.ndarray:
    keep = [body for name, body in sorted(documents) if _held_out(name) == (split == "heldout")]
    return encode(_SEPARATOR.join(keep))


def code_corpus(split: Split) -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in root.rglob("*.py") if not set(f.relative_to(root).parts[:-1]) & _SKIPPED_DIRS]
    if not files:
        raise FileNotFoundError(f"code corpus: no Python source files under the standard library at {root}")
    documents = [(f.relative_to(root).as_posix(), f.read_bytes()) for f in files]
    return Corpus("code", split, _join(documents, split), f"Python {sysconfig.get_python_version()} "
                  "standard library source, sysconfig stdlib path (PSF License)")


def chat_corpus(split: Split) -> Corpus:
    # PSF-licensed documentation text shipped with CPython; imported here, not at the top: a large module that
    # only the chat corpus needs.
    from pydoc_data.topics import topics

    documents = [(name, text.encode("utf-8")) for name, text in topics.items()]
    return Corpus("chat", split, _join(documents, split), f"Python {sysconfig.get_python_version()} "
                  "documentation topics, pydoc_data.topics (PSF License)")


# --------------------------------------------------------------------- math
_NAMES = ("Ada", "Ben", "Cleo", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jon", "Kira", "Leo", "Maya",
          "Nils", "Omar", "Pia", "Quinn", "Rosa", "Sam", "Tara")
_ITEMS = ("apples", "books", "marbles", "pencils", "stickers", "cookies", "stamps", "shells", "cards", "coins")
MATH_TRAIN_SEED = 20_240_601
MATH_HELDOUT_SEED = 20_240_602
MATH_PROBLEMS = {"train": 30_000, "heldout": 2_000}


def _problem(rng: np.random.Generator) -> str:
    """One question with a worked answer; numbers small enough that the steps are exact integers."""
    name, other = rng.choice(_NAMES, size=2, replace=False)
    item = rng.choice(_ITEMS)
    a, b, c = (int(x) for x in rng.integers(2, 60, size=3))
    kind = int(rng.integers(0, 7))
    if kind == 0:
        q = f"{name} has {a} {item}. {other} gives {name} {b} more. How many {item} does {name} have now?"
        w = f"{a} + {b} = {a + b}. The answer is {a + b}."
    elif kind == 1:
        a, b = max(a, b), min(a, b)
        q = f"{name} had {a} {item} and gave {b} of them to {other}. How many {item} are left?"
        w = f"{a} - {b} = {a - b}. The answer is {a - b}."
    elif kind == 2:
        a, b = a % 12 + 2, b % 12 + 2
        q = f"{name} buys {a} boxes of {item}. Each box holds {b} {item}. How many {item} does {name} buy?"
        w = f"{a} * {b} = {a * b}. The answer is {a * b}."
    elif kind == 3:
        b = b % 9 + 2
        total = b * (a % 15 + 1)
        q = f"{name} shares {total} {item} equally among {b} friends. How many {item} does each friend get?"
        w = f"{total} / {b} = {total // b}. The answer is {total // b}."
    elif kind == 4:
        c = min(c, a + b - 1)
        q = (f"{name} has {a} {item}, finds {b} more and then gives {c} to {other}. "
             f"How many {item} does {name} have?")
        w = f"{a} + {b} = {a + b}. {a + b} - {c} = {a + b - c}. The answer is {a + b - c}."
    elif kind == 5:
        speed, hours = a + 20, b % 6 + 2
        q = f"A train travels {speed} km per hour for {hours} hours. How far does it travel?"
        w = f"{speed} * {hours} = {speed * hours}. The answer is {speed * hours} km."
    else:
        count, price = a % 9 + 2, b % 8 + 2
        paid = count * price + c
        q = f"{name} buys {count} {item} at {price} dollars each and pays with {paid} dollars. What is the change?"
        w = (f"{count} * {price} = {count * price}. {paid} - {count * price} = {c}. "
             f"The answer is {c} dollars.")
    return f"Question: {q}\nAnswer: {w}"


def math_corpus(split: Split) -> Corpus:
    seed = MATH_TRAIN_SEED if split == "train" else MATH_HELDOUT_SEED
    rng = np.random.default_rng(seed)
    text = "\n\n".join(_problem(rng) for _ in range(MATH_PROBLEMS[split]))
    return Corpus("math", split, encode(text), f"generated arithmetic word problems (seed {seed}, "
                  f"{MATH_PROBLEMS[split]} problems; calibration.corpora)")


_LOADERS: dict[str, Callable[[Split], Corpus]] = {"code": code_corpus, "math": math_corpus, "chat": chat_corpus}


def load_corpus(domain: str, split: Split) -> Corpus:
    if domain not in _LOADERS:
        raise ValueError(f"unknown domain {domain!r}; domains: {', '.join(DOMAINS)}")
    corpus = _LOADERS[domain](split)
    if corpus.num_tokens < 4096:
        raise ValueError(f"{domain} corpus ({split}) holds only {corpus.num_tokens} bytes: {corpus.source}")
    return corpus


def domains_of(selection: str) -> tuple[str, ...]:
    """``"all"`` -> every domain; otherwise the one named domain."""
    if selection == "all":
        return DOMAINS
    if selection not in DOMAINS:
        raise ValueError(f"unknown domain {selection!r}; use one of {', '.join(DOMAINS)} or 'all'")
    return (selection,)


def sample_windows(corpora: list[Corpus], num_windows: int, window_tokens: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Random windows, the domains drawn in turn (equal shares) -> [num_windows, window_tokens] int64."""
    out = np.empty((num_windows, window_tokens), dtype=np.int64)
    which = rng.permutation(np.arange(num_windows) % len(corpora))
    for i, c in enumerate(which):
        tokens = corpora[c].tokens
        start = int(rng.integers(0, tokens.size - window_tokens))
        out[i] = tokens[start:start + window_tokens]
    return out


def sample_prompts(corpus: Corpus, num_prompts: int, prompt_tokens: int | np.ndarray,
                   rng: np.random.Generator) -> list[list[int]]:
    """Held-out prompts: ``prompt_tokens`` bytes (one length, or one per prompt) starting at the beginning of a
    random line."""
    tokens = corpus.tokens
    lengths = np.broadcast_to(np.asarray(prompt_tokens, dtype=np.int64), (num_prompts,))
    line_starts = np.flatnonzero(tokens[:-int(lengths.max()) - 1] == ord("\n")) + 1
    if line_starts.size < num_prompts:
        raise ValueError(f"{corpus.domain} corpus ({corpus.split}) has {line_starts.size} line starts; "
                         f"{num_prompts} prompts requested")
    starts = rng.choice(line_starts, size=num_prompts, replace=False)
    return [tokens[s:s + n].astype(np.int64).tolist() for s, n in zip(starts, lengths, strict=True)]


def corpus_prompts() -> Callable[[str, int, np.random.Generator], list[int]]:
    """A prompt source for the serving loop (``calibration.serving.loop.PromptSource``): held-out text of the
    request's domain, from a random offset."""
    corpora: dict[str, np.ndarray] = {}

    def draw(domain: str, num_tokens: int, rng: np.random.Generator) -> list[int]:
        if domain not in corpora:
            corpora[domain] = load_corpus(domain, "heldout").tokens
        tokens = corpora[domain]
        start = int(rng.integers(0, tokens.size - num_tokens))
        return tokens[start:start + num_tokens].astype(np.int64).tolist()
    return draw
