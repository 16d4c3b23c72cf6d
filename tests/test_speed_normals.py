"""The sampling kernel draws numpy's PCG64 normals (the same values bit for bit, the same generator state after) and
applies scipy's own ndtr; sampling ahead rewinds the generator exactly when a batch changes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from simulator.acceptance.kernels import (
    draws_numpys_normals,
    ndtr_address,
    observed_normals,
    pcg64_latent_steps,
    pcg64_state,
)
from simulator.acceptance.parametric import AcceptanceModel
from simulator.decode_set import DecodeSet
from simulator.requests import RequestStore
from simulator.sample_ahead import SampleAhead


def test_the_kernel_reproduces_numpy_and_scipy_on_this_machine():
    assert draws_numpys_normals()  # otherwise every engine would quietly fall back to numpy's (slower) draws
    assert ndtr_address() != 0  # and to the ndtr ufunc after the kernel


@pytest.mark.parametrize("seed, observe, num_steps, num_requests", [
    (0, 0, 1, 1),  # a single step of a single request
    (7, 1, 3, 5),
    (2**63 + 11, 2, 60, 100),  # 90,000 draws: every ziggurat branch (the tail ~20 times, the wedges ~600)
    (123, 0, 200, 60),
])
def test_draws_equal_numpys_and_leave_its_state(seed, observe, num_steps, num_requests):
    numpy_rng, kernel_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    state = pcg64_state(kernel_rng)
    assert state is not None
    got = observed_normals(state, observe, num_steps, num_requests, 3)
    size = 3 * num_requests
    draws = numpy_rng.standard_normal(num_steps * (2 * size + num_requests)).reshape(num_steps, -1)
    if observe < 2:
        want = draws[:, observe * size:(observe + 1) * size]
    else:
        want = np.repeat(draws[:, 2 * size:], 3, axis=1)
    np.testing.assert_array_equal(got.reshape(num_steps, -1).view(np.uint64), want.view(np.uint64))
    assert kernel_rng.bit_generator.state == numpy_rng.bit_generator.state
    # Draws of either kind go on from where the other stopped.
    assert kernel_rng.standard_normal() == numpy_rng.standard_normal()
    assert kernel_rng.integers(1 << 40) == numpy_rng.integers(1 << 40)


def test_other_bit_generators_are_left_to_numpy():
    for bit_generator in (np.random.PCG64DXSM(1), np.random.MT19937(1), np.random.Philox(1)):
        assert pcg64_state(np.random.Generator(bit_generator)) is None


@pytest.mark.parametrize("rng", [np.random.default_rng(9), np.random.Generator(np.random.MT19937(9))])
def test_sampling_ahead_with_rewinds_equals_sampling_step_by_step(rng):
    """Batches that change every few steps (the generator rewound, or the normals given back): every step sees what
    one sample_step call per step on an identical generator sees, the raw head included."""
    model = AcceptanceModel("dspark", 7)
    plain_rng = np.random.Generator(type(rng.bit_generator)(9))
    store = RequestStore()
    ids = store.add(np.zeros(60), np.arange(60) % 3, np.full(60, 10), np.full(60, 10**6),
                    np.random.default_rng(4).standard_normal(60))
    decode, ahead = DecodeSet(), SampleAhead(model, rng, 7)
    decode.add(store, ids[:5], np.full(5, 100), np.zeros(5, dtype=np.int64))
    for step in range(300):
        got = ahead.next_step(decode)
        want = model.sample_step(plain_rng, store.domain_idx[decode.ids], store.difficulty[decode.ids], 7)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), step
        if step % 7 == 3:  # a request leaves and another joins
            decode.take(np.arange(decode.size) == step % decode.size)
            joining = ids[5 + step // 7:6 + step // 7]
            decode.add(store, joining, np.full(1, 100), np.zeros(1, dtype=np.int64))  # draws not used go back


def test_the_kernels_ndtr_is_scipys_on_both_branches_and_the_tails():
    values = np.concatenate((np.linspace(-40.0, 40.0, 20_001), [0.0, -0.0, np.inf, -np.inf, 5e-324]))
    table = np.zeros((values.size, 5, 1))
    table[:, 0, 0], table[:, 3, 0] = values, 1.0  # probit = mu exactly: no spread, no loading
    confidence = np.empty((1, values.size, 1))
    pcg64_latent_steps(pcg64_state(np.random.default_rng(0)), np.empty((1, 2), dtype=np.uint64), table,
                       np.arange(values.size), np.zeros(values.size), 0.0, 0.0, 1, confidence,
                       np.empty((1, values.size), dtype=np.int64), ndtr_address())
    np.testing.assert_array_equal(confidence.ravel().view(np.uint64), ndtr(values).view(np.uint64))
