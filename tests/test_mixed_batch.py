"""One verifier forward over decoding requests and prefill chunks (attention groups), and a cache slice that reads
no device tensor: the same outputs as the forwards they replace."""

from __future__ import annotations

import pytest
import torch

from calibration.models.model import MixedBatch, VarlenBatch, build_verifier

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _setup(seed: int = 7):
    gen = torch.Generator().manual_seed(seed)
    model = build_verifier("tiny", gen, std=0.2)
    cache = model.new_cache(5, 256)
    # Three decoding requests (slots 0-2) with contexts of 40, 90 and 17 tokens; two prompts in prefill slots 3-4
    # with 0 and 33 tokens computed.
    for slot, n in ((0, 40), (1, 90), (2, 17), (4, 33)):
        tokens = torch.randint(0, model.s.vocab_size, (n,), generator=gen)
        model(tokens, cache.batch([slot], [n]), cache)
        cache.commit([slot], [n])
    return model, cache, gen


@torch.inference_mode()
def test_a_mixed_forward_equals_the_decoding_forward_and_one_forward_per_chunk() -> None:
    model, cache, gen = _setup()
    decode_lens, chunk_lens = [1, 4, 2], [60, 7]
    tokens = torch.randint(0, model.s.vocab_size, (sum(decode_lens) + sum(chunk_lens),), generator=gen)
    slots, lens = [0, 1, 2, 3, 4], decode_lens + chunk_lens
    before_k, before_v = cache.k.clone(), cache.v.clone()
    batch = cache.batch(slots, lens, groups=[3, 1, 1])
    assert isinstance(batch, MixedBatch) and [p.slots.tolist() for p in batch.parts] == [[0, 1, 2], [3], [4]]
    mixed = model(tokens, batch, cache)
    mixed_k = cache.k.clone()

    cache.k.copy_(before_k)  # the separate forwards start from the same cache and must write the same keys
    cache.v.copy_(before_v)
    decoded = sum(decode_lens)
    parts = [model(tokens[:decoded], cache.batch([0, 1, 2], decode_lens), cache)]
    offset = decoded
    for slot, n in zip((3, 4), chunk_lens, strict=True):
        parts.append(model(tokens[offset:offset + n], cache.batch([slot], [n]), cache))
        offset += n
    for field in ("logits", "features", "hidden"):
        torch.testing.assert_close(getattr(mixed, field), torch.cat([getattr(p, field) for p in parts]),
                                   rtol=1e-4, atol=1e-5)
    written = cache.lengths.tolist()
    for slot, n in enumerate(lens):  # the keys written up to each slot's new end
        end = written[slot] + n
        torch.testing.assert_close(mixed_k[:, slot, :, :end], cache.k[:, slot, :, :end], rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_one_group_is_the_plain_batch_and_bad_groups_are_refused() -> None:
    model, cache, gen = _setup()
    tokens = torch.randint(0, model.s.vocab_size, (4,), generator=gen)
    plain = model(tokens, cache.batch([0, 1], [2, 2]), cache).logits
    grouped = cache.batch([0, 1], [2, 2], groups=[2])
    assert isinstance(grouped, VarlenBatch)
    assert torch.equal(model(tokens, grouped, cache).logits, plain)
    with pytest.raises(ValueError, match=r"attention groups \[1, 2\] must be >= 1 request each and sum to the 2"):
        cache.batch([0, 1], [2, 2], groups=[1, 2])


def test_the_cache_slice_keeps_its_first_slot_on_the_host() -> None:
    _, cache, _ = _setup()
    layer = cache.k[0]
    contiguous = cache.batch([1, 2, 3], [1, 1, 1])
    assert contiguous.contiguous and contiguous.first_slot == 1 and isinstance(contiguous.first_slot, int)
    assert torch.equal(contiguous.cached(layer), layer[torch.tensor([1, 2, 3]), :, :contiguous.max_len])
    gathered = cache.batch([2, 0], [1, 3])
    assert not gathered.contiguous
    assert torch.equal(gathered.cached(layer), layer[torch.tensor([2, 0]), :, :gathered.max_len])
