"""Normals drawn by numba's generator support are numpy's (the same values bit for bit, the same generator state
after); the sampling kernel applies scipy's own ndtr; sampling ahead gives back unused draws exactly when a batch
changes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from simulator.acceptance.kernels import compiled_normals_match, latent_steps, ndtr_address, standard_normals
from simulator.acceptance.parametric import AcceptanceModel
from simulator.decode_set import DecodeSet
from simulator.requests import RequestStore
from simulator.sample_ahead import SampleAhead


def test_the_kernels_reproduce_numpy_and_scipy_on_this_machine():
    assert compiled_normals_match()  # otherwise every engine would quietly fall back to numpy's (slower) draws
    assert ndtr_address() != 0  # and to the ndtr ufunc after the kernel


@pytest.mark.parametrize("seed, size", [(0, 1), (7, 15), (2**63 + 11, 90_000), (123, 12_345)])
def test_draws_equal_numpys_and_leave_its_state(seed, size):
    numpy_rng, compiled_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    got = standard_normals(compiled_rng, size)
    want = numpy_rng.standard_normal(size)
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
    assert compiled_rng.bit_generator.state == numpy_rng.bit_generator.state
    # Draws of either kind go on from where the other stopped.
    assert compiled_rng.standard_normal() == numpy_rng.standard_normal()
    assert compiled_rng.integers(1 << 40) == numpy_rng.integers(1 << 40)


def test_other_bit_generators_draw_numpys_normals_too():
    for make in (np.random.PCG64DXSM, np.random.MT19937, np.random.Philox):
        a, b = np.random.Generator(make(1)), np.random.Generator(make(1))
        np.testing.assert_array_equal(standard_normals(a, 1000), b.standard_normal(1000))


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
    latent_steps(np.zeros((1, 3 * values.size)), table, np.arange(values.size), np.zeros(values.size), 0.0, 0.0, 1,
                 confidence, np.empty((1, values.size), dtype=np.int64), ndtr_address())
    np.testing.assert_array_equal(confidence.ravel().view(np.uint64), ndtr(values).view(np.uint64))
