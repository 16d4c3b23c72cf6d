"""The compiled PCG64 normals are numpy's: the same values, bit for bit, and the same generator state afterwards."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.acceptance.kernels import draws_numpys_normals, pcg64_standard_normals, pcg64_state
from simulator.sample_ahead import NormalStream


def test_the_kernel_reproduces_numpy_on_this_machine():
    assert draws_numpys_normals()  # otherwise every engine would quietly fall back to numpy's (slower) draws


@pytest.mark.parametrize("seed, sizes", [
    (0, [1, 2, 3]),  # single draws
    (7, [1000, 1, 999]),
    (2**63 + 11, [250_000]),  # enough draws for every ziggurat branch (the tail ~65 times, the wedges ~1,750)
    (123, [0, 5, 0, 17]),  # empty calls change nothing
])
def test_draws_equal_numpys_and_leave_its_state(seed, sizes):
    numpy_rng, kernel_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    state = pcg64_state(kernel_rng)
    assert state is not None
    for size in sizes:
        got = np.empty(size)
        pcg64_standard_normals(state, got)
        want = numpy_rng.standard_normal(size)
        np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
        assert kernel_rng.bit_generator.state == numpy_rng.bit_generator.state
    # Draws of either kind go on from where the other stopped.
    assert kernel_rng.standard_normal() == numpy_rng.standard_normal()
    got = np.empty(3)
    pcg64_standard_normals(state, got)
    np.testing.assert_array_equal(got, numpy_rng.standard_normal(3))
    assert kernel_rng.integers(1 << 40) == numpy_rng.integers(1 << 40)


def test_other_bit_generators_are_left_to_numpy():
    for bit_generator in (np.random.PCG64DXSM(1), np.random.MT19937(1), np.random.Philox(1)):
        assert pcg64_state(np.random.Generator(bit_generator)) is None
    stream = NormalStream(np.random.Generator(np.random.MT19937(4)))
    want = np.random.Generator(np.random.MT19937(4)).standard_normal(10)
    np.testing.assert_array_equal(stream.standard_normal(10), want)


def test_a_normal_stream_draws_with_the_kernel_and_serves_numpys_stream():
    stream = NormalStream(np.random.default_rng(31))
    assert stream.pcg64_state is not None
    served = [stream.standard_normal(n) for n in (40, 3, 700)]
    np.testing.assert_array_equal(np.concatenate(served), np.random.default_rng(31).standard_normal(743))
