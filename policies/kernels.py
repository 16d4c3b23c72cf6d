"""Compiled loops behind the policy helpers of :mod:`policies.base` (numba, ``cache=True``).

Each kernel computes exactly what its numpy formulation in :mod:`policies.base` computes - the same IEEE
operations on the same values in the same order - so decisions are identical, ties and NaN included
(tests/test_decision_speed_equivalence.py compares them entry by entry). They exist because a decision
over a few hundred survivals is dominated by the fixed cost of many small numpy calls, not by arithmetic.
Kernels fill arrays the caller allocates rather than return new ones (boxing a new array costs a kernel
call about a microsecond, more than a small table's arithmetic).

* :func:`survival_position_major` - prefix survivals ``a[r, j] = a[r, j - 1] * c[r, j]`` laid out [gamma, R].
* :func:`ascending_small` - a small table's values sorted (numpy's order), cheap to compile.
* :func:`survival_twice` - the same survivals, twice (the table and a copy to sort), for dspark's large tables.
* :func:`descending_positive` - the positive, non-NaN values of a table in descending order (the sorted
  path's values), sorting here for small tables and reading numpy's (vectorised) sort for large ones.
* :func:`path_throughput` - Theta after admitting 0..n entries of a sorted path.
* :func:`best_prefix_on_path` - the full search's count (first argmax of Theta) straight from a table.
* :func:`early_stop_count` - Algorithm 1's stop: entries admitted until Theta first fails to rise.
* :func:`lengths_from_kth` - top-K lengths when no tie at the K-th value is left out (the caller handles
  the rare straddling tie in numpy, in tie-break order).
* :func:`threshold_lengths` - both threshold rules, trimmed to a draft-token budget.
* :func:`length_summary` - min, max and sum of a decision's lengths, for the driver's checks.
* :func:`stale_top_k` - dspark's whole decision over a small table (survivals, capacity, top-K lengths) in one call.

The first call of each kernel compiles it (or loads it from numba's on-disk cache, ``__pycache__``).
"""

from __future__ import annotations

import numba
import numpy as np

# Objectives as the kernels take them (policies.base.Objective names them).
TOKENS_X_SPS = 0
TOKENS_PER_S = 1


@numba.njit(cache=True)
def survival_position_major(confidence, by_position):  # [R, gamma] float64 -> fills [gamma, R]
    """a[r, j] = prod_{i <= j} c[r, i], multiplied left to right, laid out position-major into ``by_position``."""
    num_requests, gamma = confidence.shape
    for r in range(num_requests):
        running = 1.0
        for j in range(gamma):
            running = running * confidence[r, j] if j else confidence[r, j]
            by_position[j, r] = running


@numba.njit(cache=True)
def ascending_small(values):  # [n] float64 -> [n], for small tables
    """``np.sort(values)`` (ascending, NaN last) by insertion: the same values in the same order (equal values are
    interchangeable), quadratic but quick for the few dozen survivals of a small table, and far cheaper to compile
    than numba's ``np.sort`` (which a run would otherwise compile at its start)."""
    out = np.empty(values.size)
    for n in range(values.size):
        value = values[n]
        i = n
        if value == value:  # a NaN stays last; any other value goes before every larger value and NaN
            while i > 0 and not out[i - 1] <= value:
                out[i] = out[i - 1]
                i -= 1
        out[i] = value
    return out


@numba.njit(cache=True)
def survival_twice(confidence, buffer):  # [R, gamma] float64 -> fills buffer [2 R gamma]
    """The survivals of :func:`survival_position_major`, position-major, written twice into ``buffer``: the table
    (first half) and a copy to sort (second half). Position by position, so both are written in memory order."""
    num_requests, gamma = confidence.shape
    size = num_requests * gamma
    for j in range(gamma):
        start = j * num_requests
        for r in range(num_requests):
            value = buffer[start - num_requests + r] * confidence[r, j] if j else confidence[r, j]
            buffer[start + r] = value
            buffer[size + start + r] = value


@numba.njit(cache=True)
def descending_positive(values, presorted):  # [N] float64 -> ([n] float64, bool)
    """The entries > 0 of ``values`` in descending order and whether ``values`` is free of NaN.

    ``presorted``: ``values`` is already in ascending order (NaN last, as numpy sorts); otherwise it is
    sorted here (:func:`ascending_small`, also NaN last: small tables only). NaN entries are dropped, like every
    non-positive one.
    """
    ascending = values if presorted else ascending_small(values)
    top = ascending.size
    while top > 0 and ascending[top - 1] != ascending[top - 1]:  # NaN
        top -= 1
    nan_free = top == ascending.size
    bottom = top
    while bottom > 0 and ascending[bottom - 1] > 0.0:
        bottom -= 1
    out = np.empty(top - bottom)
    for i in range(top - bottom):
        out[i] = ascending[top - 1 - i]
    return out, nan_free


@numba.njit(cache=True)
def path_throughput(survivals, num_requests, sps, objective, draft_s):  # [n] -> [n + 1]
    """Theta after admitting 0..n entries: tau* = R + (running sum from the left), times SPS (or per second).

    ``sps[n]`` is SPS at ``num_requests + n`` batch tokens. The running sum starts with the first entry
    itself (as ``np.add.accumulate`` does) and R is added afterwards, as the numpy formulation does.
    """
    count = survivals.size
    theta = np.empty(count + 1)
    running = 0.0
    for n in range(count + 1):
        if n:
            running = running + survivals[n - 1] if n > 1 else survivals[0]
        expected = running + num_requests
        if objective == TOKENS_X_SPS:
            theta[n] = expected * sps[n]
        else:
            theta[n] = expected / (draft_s + 1.0 / sps[n])
    return theta


@numba.njit(cache=True)
def best_prefix_on_path(values, presorted, num_requests, sps, objective, draft_s, limit):  # -> int
    """The first argmax of Theta along the sorted path of ``values``, cut after ``limit`` entries; -1 when
    ``sps`` does not reach the path's end (the caller then raises the profile's error).

    The same numbers as ``path_throughput(descending_positive(values))`` followed by ``argmax`` (which
    returns the first NaN when there is one), without building either array.
    """
    ascending = values if presorted else ascending_small(values)
    top = ascending.size
    while top > 0 and ascending[top - 1] != ascending[top - 1]:  # NaN: not on the path
        top -= 1
    bottom = top
    while bottom > 0 and ascending[bottom - 1] > 0.0:
        bottom -= 1
    count = min(top - bottom, limit)
    if sps.size < count + 1:
        return -1
    best, best_theta, running = 0, 0.0, 0.0
    for n in range(count + 1):
        if n:
            running = running + ascending[top - n] if n > 1 else ascending[top - 1]
        expected = running + num_requests
        theta = expected * sps[n] if objective == TOKENS_X_SPS else expected / (draft_s + 1.0 / sps[n])
        if theta != theta:
            return n
        if n == 0 or theta > best_theta:
            best, best_theta = n, theta
    return best


@numba.njit(cache=True)
def early_stop_count(theta):  # [n + 1] -> int
    """The first n with theta[n + 1] <= theta[n] (NaN compares false, so it stops there); n when Theta always rises."""
    for n in range(1, theta.size):
        if not theta[n] > theta[n - 1]:
            return n - 1
    return max(theta.size - 1, 0)


@numba.njit(cache=True)
def lengths_from_kth(by_position, k, kth, select, lengths):  # [gamma, R] -> bool, fills [R] int64 zeros
    """Top-k lengths (k >= 1) into ``lengths`` (zeros on entry) that admit every entry >= ``kth`` (the k-th
    largest) when it is positive and exactly k entries are >= kth, or every positive entry when there are at
    most k; False when a tie at the k-th value straddles the cut (only the first ties in tie-break order fit:
    the caller decides).

    ``select``: find the k-th largest here (k < R gamma; sorting a copy, for small tables), giving up
    (``False``) on a NaN, whose place in numpy's order the caller keeps.
    """
    gamma, num_requests = by_position.shape
    if select:
        flat = np.empty(gamma * num_requests)
        for j in range(gamma):
            for r in range(num_requests):
                value = by_position[j, r]
                if value != value:
                    return False
                flat[j * num_requests + r] = value
        kth = ascending_small(flat)[flat.size - k]
    at_or_above = 0
    positive = 0
    for j in range(gamma):  # counts, and the lengths the bound kth admits (the answer in both common cases)
        for r in range(num_requests):
            value = by_position[j, r]
            if value >= kth:
                at_or_above += 1
                if value > 0.0:
                    lengths[r] += 1
            if value > 0.0:
                positive += 1
    if kth > 0.0 and at_or_above == k:  # the common case: no tie at the k-th value is left out
        return True
    if positive > k:
        return False
    if not kth <= 0.0:  # every positive entry fits, some below kth (or kth is NaN): count them all
        lengths[:] = 0
        for j in range(gamma):
            for r in range(num_requests):
                if by_position[j, r] > 0.0:
                    lengths[r] += 1
    return True


@numba.njit(cache=True)
def threshold_lengths(confidence, by_position, theta, prefix, has_budget, draft_budget):  # -> ([R] int64, sum)
    """l_r = #{j : a[r, j] >= theta} (``prefix``) or the length of the run of c[r, j] >= theta from j = 1,
    then, with a budget, cut in request order so that they sum to at most ``draft_budget``; and their sum."""
    gamma, num_requests = by_position.shape
    lengths = np.zeros(num_requests, dtype=np.int64)
    total = 0
    for r in range(num_requests):
        length = 0
        for j in range(gamma):
            if prefix:
                if by_position[j, r] >= theta:
                    length += 1
            elif confidence[r, j] >= theta:
                length += 1
            else:
                break
        lengths[r] = length
        total += length
    if has_budget and total > draft_budget:
        before = 0
        total = 0
        for r in range(num_requests):
            length = lengths[r]
            lengths[r] = min(max(draft_budget - before, 0), length)
            before += length
            total += lengths[r]
    return lengths, total


@numba.njit(cache=True)
def length_summary(lengths):  # [R] int64 -> (min, max, sum)
    low, high, total = 0, 0, 0
    for i in range(lengths.size):
        value = lengths[i]
        if i == 0 or value < low:
            low = value
        if i == 0 or value > high:
            high = value
        total += value
    return low, high, total


@numba.njit(cache=True)
def stale_top_k(confidence, by_position, stale, presorted, num_old, sps, objective, draft_s, limit, lengths):
    """dspark's decision in one call: survivals of ``confidence`` [R, gamma] into ``by_position`` [gamma, R], the
    capacity K from the stale pool's values ``stale`` (see :func:`best_prefix_on_path`), and the top-K lengths
    into ``lengths`` [R] (zeros on entry) -> (K, whether ``lengths`` holds them). K is -1 when ``sps`` does not
    reach the stale path's end; the lengths are left to the caller when a tie straddles the K-th value or a NaN
    is in the table (see :func:`lengths_from_kth`), which selects the K-th value here (small tables only)."""
    survival_position_major(confidence, by_position)
    capacity = best_prefix_on_path(stale, presorted, num_old, sps, objective, draft_s, limit)
    if capacity <= 0:
        return capacity, capacity == 0
    size = by_position.size
    return capacity, lengths_from_kth(by_position, capacity, 0.0, capacity < size, lengths)
