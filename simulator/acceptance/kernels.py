"""Compiled kernels (numba) of the parametric acceptance model's sampling.

* :func:`latent_steps` does in one pass what the numpy formulation did in a
  dozen array operations, with the same floating-point operations in the same
  order (no fused multiply-adds: numba does not contract without ``fastmath``),
  so its values are the numpy ones bit for bit. The normal CDF is scipy's own
  compiled ``ndtr``, called per value from the kernel through its
  ``cython_special`` address (:func:`ndtr_address`), or the ufunc
  ``scipy.special.ndtr`` over the block afterwards: the same function either way.
* :func:`pcg64_latent_steps` draws what ``Generator.standard_normal`` draws
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

__all__ = ["draws_numpys_normals", "latent_steps", "ndtr_address", "observed_normals", "pcg64_latent_steps",
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


@numba.njit(cache=True)
def pcg64_latent_steps(state: np.ndarray, step_states: np.ndarray, table: np.ndarray, rows: np.ndarray,
                       ease: np.ndarray, request_spread: float, step_spread: float, num_draft_tokens: int,
                       confidence: np.ndarray, accepted: np.ndarray, normal_cdf: int) -> None:
    """:func:`latent_steps` drawing each step's 2 R g + R normals here, in numpy's order and with numpy's values,
    from the PCG64 state [4] uint64 (see :func:`pcg64_state`, advanced in place); ``step_states`` [K, 2] uint64
    gets the LCG state (low, high) after each step's draws (to rewind to, for steps not used).

    One function, the helpers of :func:`latent_steps` written out in it: each compiled function adds to the cold
    start of a run (this kernel is the one every engine uses).
    """
    num_steps, num_requests = accepted.shape
    g = num_draft_tokens
    size = num_requests * g
    draws = np.empty(2 * size + num_requests)
    low, high, inc_low, inc_high = state[0], state[1], state[2], state[3]
    for k in range(num_steps):
        for i in range(draws.size):
            # numpy's random_standard_normal (distributions.c), operation for operation; the state stays in
            # registers, the rare branches are out of line.
            while True:
                low, high = _lcg_step(low, high, inc_low, inc_high)
                mixed, rotation = high ^ low, high >> _U58
                bits = (mixed >> rotation) | (mixed << ((_U64 - rotation) & _U63))  # PCG64's XSL-RR output
                idx = np.intp(bits & _BYTE)
                bits >>= _U8
                rabs = (bits >> _ONE) & _MANTISSA
                x = rabs * _WI[idx]
                if bits & _ONE:
                    x = -x
                if rabs < _KI[idx]:
                    break  # 99.3% of the draws
                done, x, low, high = _normal_rare(low, high, inc_low, inc_high, idx, rabs, x)
                if done:
                    break
            draws[i] = x
        step_states[k, 0], step_states[k, 1] = low, high
        for r in range(num_requests):  # as _latent_step
            row = rows[r]
            shift = request_spread * ease[r] + step_spread * draws[2 * size + r]
            count = g
            for j in range(g):
                n0 = draws[r * g + j]
                base = table[row, 0, j] + shift
                if count == g and table[row, 4, j] * n0 + base <= 0.0:
                    count = j
                value = base + table[row, 1, j] * n0
                value = value + table[row, 2, j] * draws[size + r * g + j]
                confidence[k, r, j] = value * table[row, 3, j]
            accepted[k, r] = count
    state[0], state[1] = low, high
    if not normal_cdf:
        return
    values = confidence.reshape(-1)  # as _apply_cdf
    order = np.empty((3, values.size), dtype=np.int64)
    grouped = np.empty((3, values.size))
    inner = negative = wide = 0  # counted in registers, by arithmetic, not branches: nothing to mispredict here
    for i in range(values.size):
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
    counts = (inner, negative, wide)
    for group in range(3):
        for n in range(counts[group]):
            grouped[group, n] = _call_cdf(normal_cdf, grouped[group, n])
        for n in range(counts[group]):
            values[order[group, n]] = grouped[group, n]


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
    words = _state_words(np.random.default_rng(0))
    if words is None:
        return 0
    pcg64_latent_steps(words, np.empty((1, 2), dtype=np.uint64), table, np.arange(values.size), np.zeros(values.size),
                       0.0, 0.0, 1, got, np.empty((1, values.size), dtype=np.int64), address)
    return address if np.array_equal(got.ravel().view(np.uint64), ndtr(values).view(np.uint64)) else 0


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


@numba.njit(cache=True)
def _next_uint64(low, high, inc_low, inc_high):
    """One step of the generator whose LCG state is (low, high) -> (new low, new high, its 64-bit output)."""
    low, high = _lcg_step(low, high, inc_low, inc_high)
    value = high ^ low
    rotation = high >> _U58
    return low, high, (value >> rotation) | (value << ((_U64 - rotation) & _U63))


@numba.njit(cache=True)
def _normal_rare(low, high, inc_low, inc_high, idx, rabs, x):
    """The ziggurat's rare branches (the tail for box 0, a wedge otherwise) for a draw outside its box -> (whether
    it gives a normal, the normal, new low, new high); out of line, so that the common path stays small. A
    uniform ``next_double`` is ``(bits >> 11) * 2^-53``."""
    if idx == 0:
        while True:
            low, high, bits = _next_uint64(low, high, inc_low, inc_high)
            xx = -_NOR_INV_R * np.log1p(-((bits >> _U11) * _TO_UNIT))
            low, high, bits = _next_uint64(low, high, inc_low, inc_high)
            yy = -np.log1p(-((bits >> _U11) * _TO_UNIT))
            if yy + yy > xx * xx:
                return True, (-(_NOR_R + xx) if (rabs >> _U8) & _ONE else _NOR_R + xx), low, high
    low, high, bits = _next_uint64(low, high, inc_low, inc_high)
    accept = (_FI[idx - 1] - _FI[idx]) * ((bits >> _U11) * _TO_UNIT) + _FI[idx] < np.exp(-0.5 * x * x)
    return accept, x, low, high


class _StateMemory(ctypes.c_uint64 * 4):  # a ctypes array that can hold a reference to its generator
    pass


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
    memory = _StateMemory.from_address(address)
    memory.generator = generator  # the view keeps the generator, whose memory it is, alive
    words = np.ctypeslib.as_array(memory)
    reported = bit_generator.state["state"]
    mask = (1 << 64) - 1
    expected = [reported["state"] & mask, reported["state"] >> 64, reported["inc"] & mask, reported["inc"] >> 64]
    return words if [int(w) for w in words] == expected else None


def observed_normals(words: np.ndarray, observe: int, num_steps: int = 40, num_requests: int = 50,
                     gamma: int = 7) -> np.ndarray:
    """Draws of :func:`pcg64_latent_steps` made visible (its output is then the draws themselves): n0
    (``observe`` 0), n1 (1) or the steps' shifts (2, repeated over the positions) -> [K, R, g]. For the checks."""
    table = np.zeros((1, 5, gamma))
    table[0, 3] = 1.0  # probit = (mu + shift + l0 n0 + l1 n1) * 1, every term zero but the observed one
    if observe < 2:
        table[0, 1 + observe] = 1.0
    confidence = np.empty((num_steps, num_requests, gamma))
    pcg64_latent_steps(words, np.empty((num_steps, 2), dtype=np.uint64), table, np.zeros(num_requests, dtype=np.int64),
                       np.zeros(num_requests), 0.0, 1.0 if observe == 2 else 0.0, gamma, confidence,
                       np.empty((num_steps, num_requests), dtype=np.int64), 0)
    return confidence


@functools.cache
def draws_numpys_normals() -> bool:
    """Whether :func:`pcg64_latent_steps` draws numpy's normals and leaves numpy's state: checked once, on every
    kind of draw (n0, n1, the shifts: 90,000 normals, enough to take every branch of the ziggurat)."""
    num_steps, num_requests, gamma = 40, 50, 7
    for observe in range(3):
        numpy_rng, kernel_rng = np.random.default_rng(observe), np.random.default_rng(observe)
        words = _state_words(kernel_rng)
        if words is None:
            return False
        got = observed_normals(words, observe, num_steps, num_requests, gamma)
        size = num_requests * gamma
        draws = numpy_rng.standard_normal(num_steps * (2 * size + num_requests)).reshape(num_steps, -1)
        if observe < 2:
            want = draws[:, observe * size:(observe + 1) * size].reshape(num_steps, num_requests, gamma)
        else:
            want = np.repeat(draws[:, 2 * size:], gamma, axis=1).reshape(num_steps, num_requests, gamma)
        if not (np.array_equal(got.view(np.uint64), want.view(np.uint64))
                and numpy_rng.bit_generator.state == kernel_rng.bit_generator.state):
            return False
    return True


def pcg64_state(generator: np.random.Generator) -> np.ndarray | None:
    """The state :func:`pcg64_latent_steps` draws ``generator``'s normals from (a view of its memory: draws
    of either kind advance both), or None when numpy must draw them: another bit generator, or a numpy whose
    PCG64 or ziggurat this kernel does not reproduce. The view keeps ``generator`` alive."""
    words = _state_words(generator)
    return words if words is not None and draws_numpys_normals() else None
