"""Compiled kernels (numba) of the parametric acceptance model's sampling.

* :func:`latent_steps` does in one pass what the numpy formulation did in a
  dozen array operations, with the same floating-point operations in the same
  order (no fused multiply-adds: numba does not contract without ``fastmath``),
  so its values are the numpy ones bit for bit. The normal CDF is scipy's own
  compiled ``ndtr``, called per value from the kernel through its
  ``cython_special`` address (:func:`ndtr_address`), or the ufunc
  ``scipy.special.ndtr`` over the block afterwards: the same function either way.
* :func:`pcg64_standard_normals` draws what ``Generator.standard_normal`` draws
  from a PCG64 bit generator (numpy's default): the same 128-bit LCG and XSL-RR
  output, numpy's ziggurat with its tables and branches, reading and advancing
  the generator's own state in place - the same values and the same state
  afterwards, without numpy's indirect call per draw. :func:`pcg64_state` hands
  out that state only after checking, once per process, that the kernel gives
  numpy's values (:func:`draws_numpys_normals`); otherwise numpy keeps drawing.
"""

from __future__ import annotations

import ctypes
import functools

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import get_cython_function_address, intrinsic
from numba.np.random._constants import fi_double, ki_double, wi_double, ziggurat_nor_inv_r, ziggurat_nor_r
from scipy.special import cython_special, ndtr

__all__ = ["draws_numpys_normals", "latent_steps", "ndtr_address", "pcg64_latent_steps", "pcg64_standard_normals",
           "pcg64_state"]


@intrinsic
def _call_cdf(typingctx, address, x):
    """Call the C function ``double f(double, int)`` at ``address`` (cython_special's calling convention)."""
    if address != types.int64 or x != types.float64:
        return None

    def codegen(context, builder, sig, args):
        function = ir.FunctionType(ir.DoubleType(), [ir.DoubleType(), ir.IntType(32)])
        return builder.call(builder.inttoptr(args[0], function.as_pointer()), [args[1], ir.Constant(ir.IntType(32), 0)])

    return types.float64(types.int64, types.float64), codegen


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True)
def pcg64_latent_steps(state: np.ndarray, step_states: np.ndarray, draws: np.ndarray, table: np.ndarray,
                       rows: np.ndarray, ease: np.ndarray, request_spread: float, step_spread: float,
                       num_draft_tokens: int, confidence: np.ndarray, accepted: np.ndarray, normal_cdf: int) -> None:
    """:func:`latent_steps` drawing each step's normals here, into ``draws`` [2 R g + R], from the PCG64 state
    [4] uint64 (see :func:`pcg64_state`, advanced in place) as :func:`pcg64_standard_normals` does; ``step_states``
    [K, 2] uint64 gets the LCG state (low, high) after each step's draws (to rewind to, for steps not used)."""
    low, high, inc_low, inc_high = state[0], state[1], state[2], state[3]
    for k in range(accepted.shape[0]):
        for i in range(draws.size):
            draws[i], low, high = _standard_normal(low, high, inc_low, inc_high)
        step_states[k, 0], step_states[k, 1] = low, high
        _latent_step(draws, table, rows, ease, request_spread, step_spread, num_draft_tokens, confidence[k],
                     accepted[k])
    state[0], state[1] = low, high
    if normal_cdf:
        _apply_cdf(confidence.reshape(-1), normal_cdf)


@numba.njit(cache=True)
def _normal_cdf_each(values: np.ndarray, normal_cdf: int) -> None:
    _apply_cdf(values, normal_cdf)


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
    got = values.copy()
    _normal_cdf_each(got, address)
    return address if np.array_equal(got.view(np.uint64), ndtr(values).view(np.uint64)) else 0


# ---------------------------------------------------------------------------------- numpy's normals from PCG64

_MULTIPLIER = (2549297995355413924 << 64) | 4865540595714422341  # PCG's default 128-bit LCG multiplier
_KI = ki_double.astype(np.uint64)  # numpy's ziggurat tables (numba copies them from numpy's source)
_WI = wi_double.astype(np.float64)
_FI = fi_double.astype(np.float64)
_NOR_R, _NOR_INV_R = float(ziggurat_nor_r), float(ziggurat_nor_inv_r)
_ONE, _BYTE, _MANTISSA = np.uint64(1), np.uint64(0xFF), np.uint64(0x000FFFFFFFFFFFFF)
_U8, _U11, _U58, _U63, _U64 = np.uint64(8), np.uint64(11), np.uint64(58), np.uint64(63), np.uint64(64)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2^-53, numpy's next_double


@intrinsic
def _lcg_step(typingctx, low, high, inc_low, inc_high):
    """(state * multiplier + increment) mod 2^128 on (low, high) uint64 halves -> the new (low, high)."""
    if not all(arg == types.uint64 for arg in (low, high, inc_low, inc_high)):
        return None
    signature = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64, types.uint64, types.uint64)

    def codegen(context, builder, sig, args):
        wide, half = ir.IntType(128), ir.IntType(64)

        def join(lo, hi):
            return builder.or_(builder.zext(lo, wide), builder.shl(builder.zext(hi, wide), ir.Constant(wide, 64)))

        state = builder.add(builder.mul(join(args[0], args[1]), ir.Constant(wide, _MULTIPLIER)),
                            join(args[2], args[3]))
        new = (builder.trunc(state, half), builder.trunc(builder.lshr(state, ir.Constant(wide, 64)), half))
        return context.make_tuple(builder, sig.return_type, new)

    return signature, codegen


@numba.njit(cache=True, inline="always")
def _next_uint64(low, high, inc_low, inc_high):
    """One step of the generator whose LCG state is (low, high) -> (new low, new high, its 64-bit output)."""
    low, high = _lcg_step(low, high, inc_low, inc_high)
    value = high ^ low
    rotation = high >> _U58
    return low, high, (value >> rotation) | (value << ((_U64 - rotation) & _U63))


@numba.njit(cache=True, inline="always")
def _standard_normal(low, high, inc_low, inc_high):
    """numpy's ``random_standard_normal`` (distributions.c), operation for operation -> (the normal, new low, new
    high); a uniform ``next_double`` is ``(bits >> 11) * 2^-53``. The state stays in registers, not memory."""
    while True:
        low, high, bits = _next_uint64(low, high, inc_low, inc_high)
        idx = np.intp(bits & _BYTE)
        bits >>= _U8
        sign = bits & _ONE
        rabs = (bits >> _ONE) & _MANTISSA
        x = rabs * _WI[idx]
        if sign:
            x = -x
        if rabs < _KI[idx]:
            return x, low, high  # 99.3% of the draws
        if idx == 0:
            while True:
                low, high, bits = _next_uint64(low, high, inc_low, inc_high)
                xx = -_NOR_INV_R * np.log1p(-((bits >> _U11) * _TO_UNIT))
                low, high, bits = _next_uint64(low, high, inc_low, inc_high)
                yy = -np.log1p(-((bits >> _U11) * _TO_UNIT))
                if yy + yy > xx * xx:
                    return (-(_NOR_R + xx) if (rabs >> _U8) & _ONE else _NOR_R + xx), low, high
        else:
            low, high, bits = _next_uint64(low, high, inc_low, inc_high)
            if (_FI[idx - 1] - _FI[idx]) * ((bits >> _U11) * _TO_UNIT) + _FI[idx] < np.exp(-0.5 * x * x):
                return x, low, high


@numba.njit(cache=True)
def pcg64_standard_normals(state: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` [n] with the next n standard normals of the PCG64 whose state [4] uint64 (see
    :func:`pcg64_state`) is given, advancing it in place."""
    low, high, inc_low, inc_high = state[0], state[1], state[2], state[3]
    for i in range(out.size):
        out[i], low, high = _standard_normal(low, high, inc_low, inc_high)
    state[0], state[1] = low, high


def _state_words(generator: np.random.Generator) -> np.ndarray | None:
    """A writable view [4] uint64 of a PCG64 generator's own LCG state and increment (low halves first), or None
    for another bit generator or when its memory does not hold what its ``state`` reports."""
    bit_generator = getattr(generator, "bit_generator", None)
    if type(bit_generator) is not np.random.PCG64:
        return None
    # numpy's pcg64_state starts with a pointer to the 128-bit state and increment, in that order.
    address = ctypes.c_void_p.from_address(bit_generator.ctypes.state_address).value
    if not address:
        return None
    words = np.ctypeslib.as_array((ctypes.c_uint64 * 4).from_address(address))
    reported = bit_generator.state["state"]
    mask = (1 << 64) - 1
    expected = [reported["state"] & mask, reported["state"] >> 64, reported["inc"] & mask, reported["inc"] >> 64]
    return words if [int(w) for w in words] == expected else None


@functools.cache
def draws_numpys_normals() -> bool:
    """Whether :func:`pcg64_standard_normals` gives numpy's values and leaves numpy's state (checked once, on
    enough draws to take every branch of the ziggurat)."""
    for seed in (0, 12345):
        numpy_rng, kernel_rng = np.random.default_rng(seed), np.random.default_rng(seed)
        words = _state_words(kernel_rng)
        if words is None:
            return False
        want, got = numpy_rng.standard_normal(100_000), np.empty(100_000)
        pcg64_standard_normals(words, got)
        if not (np.array_equal(want.view(np.uint64), got.view(np.uint64))
                and numpy_rng.bit_generator.state == kernel_rng.bit_generator.state):
            return False
    return True


def pcg64_state(generator: np.random.Generator) -> np.ndarray | None:
    """The state :func:`pcg64_standard_normals` draws ``generator``'s normals from (a view of its memory: draws
    of either kind advance both), or None when numpy must draw them: another bit generator, or a numpy whose
    PCG64 or ziggurat this kernel does not reproduce. The view is valid while ``generator`` lives."""
    words = _state_words(generator)
    return words if words is not None and draws_numpys_normals() else None
