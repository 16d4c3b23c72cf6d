"""Compiled kernels (numba) of the parametric acceptance model's sampling.

* :func:`latent_steps` does in one pass what the numpy formulation did in a
  dozen array operations, with the same floating-point operations in the same
  order (no fused multiply-adds: numba does not contract without ``fastmath``),
  so its values are the numpy ones bit for bit. The normal CDF is scipy's own
  compiled ``ndtr``, called per value from the kernel through its
  ``cython_special`` address (:func:`ndtr_address`), or the ufunc
  ``scipy.special.ndtr`` over the block afterwards: the same function either way.
* :func:`standard_normals` draws what ``Generator.standard_normal`` draws,
  through numba's own support for numpy generators (the same algorithm on the
  same bit generator: the same values and the same state afterwards, about
  twice as fast as numpy's per-draw indirect calls). It is used only after a
  check, once per process, that numba's draws are numpy's
  (:func:`compiled_normals_match`); otherwise numpy draws them.
"""

from __future__ import annotations

import ctypes
import functools

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import get_cython_function_address, intrinsic
from scipy.special import cython_special, ndtr

__all__ = ["compiled_normals_match", "latent_steps", "ndtr_address", "standard_normals"]


@intrinsic
def _call_cdf(typingctx, address, x):
    """Call the C function ``double f(double, int)`` at ``address`` (cython_special's calling convention)."""
    if address != types.int64 or x != types.float64:
        return None

    def codegen(context, builder, sig, args):
        function = ir.FunctionType(ir.DoubleType(), [ir.DoubleType(), ir.IntType(32)])
        return builder.call(builder.inttoptr(args[0], function.as_pointer()), [args[1], ir.Constant(ir.IntType(32), 0)])

    return types.float64(types.int64, types.float64), codegen


@numba.njit(cache=True)
def _latent_step(step, table, rows, ease, request_spread, step_spread, num_draft_tokens, probit, accepted):
    """One step of :func:`latent_steps`: ``step`` [2 R g + R] its draws, ``probit`` [R, g], ``accepted`` [R]."""
    num_requests, g = accepted.size, num_draft_tokens
    size = num_requests * g
    for r in range(num_requests):
        row = rows[r]
        shift = request_spread * ease[r] + step_spread * step[2 * size + r]
        count = g
        for j in range(g):
            n0 = step[r * g + j]
            base = table[row, 0, j] + shift
            if count == g and table[row, 4, j] * n0 + base <= 0.0:
                count = j
            value = base + table[row, 1, j] * n0
            value = value + table[row, 2, j] * step[size + r * g + j]
            probit[r, j] = value * table[row, 3, j]
        accepted[r] = count


@numba.njit(cache=True)
def _apply_cdf(values, normal_cdf):
    """``values[i] = ndtr(values[i])`` for every i, with scipy's compiled ndtr at ``normal_cdf``. The values are
    copied into three contiguous groups by the branch ndtr takes for them (|x| >= sqrt 2, else x >= 0, else
    x < 0), computed group by group and copied back: in random order its branches are mispredicted about half
    the time, which costs ndtr about 40% of its time."""
    size = values.size
    order = np.empty((3, size), dtype=np.int64)
    grouped = np.empty((3, size))
    counts = np.zeros(3, dtype=np.int64)
    inner = negative = wide = 0  # arithmetic, not branches: nothing to mispredict while grouping
    for i in range(size):
        x = values[i]
        is_wide = np.int64(abs(x) >= 1.4142135623730951)
        is_negative = np.int64(x < 0.0) * (1 - is_wide)
        is_inner = 1 - is_wide - is_negative
        n = wide * is_wide + negative * is_negative + inner * is_inner
        order[2 * is_wide + is_negative, n] = i
        grouped[2 * is_wide + is_negative, n] = x
        wide += is_wide
        negative += is_negative
        inner += is_inner
    counts[0], counts[1], counts[2] = inner, negative, wide
    for group in range(3):
        for n in range(counts[group]):
            grouped[group, n] = _call_cdf(normal_cdf, grouped[group, n])
    for group in range(3):
        for n in range(counts[group]):
            values[order[group, n]] = grouped[group, n]


@numba.njit(cache=True)
def latent_steps(draws: np.ndarray, table: np.ndarray, rows: np.ndarray, ease: np.ndarray, request_spread: float,
                 step_spread: float, num_draft_tokens: int, confidence: np.ndarray, accepted: np.ndarray,
                 normal_cdf: int) -> None:
    """Fill ``confidence`` [K, R, g] (C order) and ``accepted`` [K, R].

    ``draws`` [K, 2 R g + R]: per step n0 [R, g], n1 [R, g], then the step's shifts [R]; ``table`` [C, 5, gamma]
    (mu, loading of W on n0, on n1, 1/psd, scale of A), ``rows`` [R] each request's row of it, ``ease`` [R]
    its z. Accepted draft count = index of the first position whose latent A + shift is <= 0 (g when none).
    ``normal_cdf``: the address of scipy's compiled ndtr (:func:`ndtr_address`), applied to each probit here, or
    0: the probits are left for the caller's ``ndtr``.
    """
    for k in range(accepted.shape[0]):
        _latent_step(draws[k], table, rows, ease, request_spread, step_spread, num_draft_tokens, confidence[k],
                     accepted[k])
    if normal_cdf:
        _apply_cdf(confidence.reshape(-1), normal_cdf)


@functools.cache
def ndtr_address() -> int:
    """The address of scipy's compiled ndtr for doubles (``scipy.special.cython_special``) when the kernels calling
    it get the values of the ufunc ``scipy.special.ndtr``, checked once per process on both branches of the
    function, its tails and its special values; 0 otherwise (the caller applies the ufunc)."""
    name = "__pyx_fuse_1ndtr"  # the double specialisation of the fused ndtr
    try:
        capsule = cython_special.__pyx_capi__[name]
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        if get_name(capsule) != b"double (double, int __pyx_skip_dispatch)":
            return 0
        address = get_cython_function_address("scipy.special.cython_special", name)
    except (AttributeError, KeyError, ValueError):
        return 0
    spread = np.repeat([0.5, 2.0, 8.0, 30.0], 12_500)
    values = np.concatenate((np.random.default_rng(0).standard_normal(spread.size) * spread,
                             [0.0, -0.0, np.inf, -np.inf, 5e-324, -40.0, 40.0, np.sqrt(2.0), -np.sqrt(2.0)]))
    # Through the sampling kernel itself: one class per value, probit = mu exactly (every other term is zero).
    table = np.zeros((values.size, 5, 1))
    table[:, 0, 0], table[:, 3, 0] = values, 1.0
    got = np.empty((1, values.size, 1))
    draws = np.zeros((1, 3 * values.size))  # n0, n1 and the shifts: zero
    latent_steps(draws, table, np.arange(values.size), np.zeros(values.size), 0.0, 0.0, 1, got,
                 np.empty((1, values.size), dtype=np.int64), address)
    return address if np.array_equal(got.ravel().view(np.uint64), ndtr(values).view(np.uint64)) else 0


# ---------------------------------------------------------------------------------- numpy's normals, compiled


@numba.njit(cache=True)
def _fill_standard_normal(generator, out):
    for i in range(out.size):
        out[i] = generator.standard_normal()


@functools.cache
def compiled_normals_match() -> bool:
    """Whether numba's ``Generator.standard_normal`` gives numpy's values and leaves numpy's state, checked once
    per process on 90,000 draws (enough to take every branch of the ziggurat)."""
    compiled, reference = np.random.default_rng(20261130), np.random.default_rng(20261130)
    got = np.empty(90_000)
    _fill_standard_normal(compiled, got)
    want = reference.standard_normal(got.size)
    return (np.array_equal(got.view(np.uint64), want.view(np.uint64))
            and compiled.bit_generator.state == reference.bit_generator.state)


def standard_normals(generator: np.random.Generator, size: int) -> np.ndarray:
    """``generator.standard_normal(size)``: the same values and state, drawn by numba where that was checked to be
    exact (a PCG64 bit generator, numpy's default), by numpy otherwise."""
    if type(generator.bit_generator) is np.random.PCG64 and compiled_normals_match():
        out = np.empty(size)
        _fill_standard_normal(generator, out)
        return out
    return generator.standard_normal(size)
