"""The attention-path benchmark (calibration.profiling.attention_paths): its rewrites of the verifier's attention
are exact, so what it times is the path, not a different computation."""

from __future__ import annotations

import pytest
import torch

from calibration.models.model import attend
from calibration.profiling.attention_paths import PATHS, folded, main, verification_mask


@pytest.mark.parametrize("queries", [1, 3, 8])
def test_folding_gqa_heads_into_the_query_axis_gives_the_verifiers_attention(queries: int) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 8, queries, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(3, 2, 21 + queries, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = verification_mask(3, 21, queries, 21 + queries, torch.device("cpu"))
    torch.testing.assert_close(folded(q, k, v, mask), attend(q, k, v, mask), rtol=1e-12, atol=1e-12)
    # padding keys to 32 with masked-out keys changes nothing either
    kp, vp = (torch.cat([t, torch.randn(3, 2, 32 - t.shape[2], 16, generator=gen, dtype=torch.float64)], dim=2)
              for t in (k, v))
    padded = verification_mask(3, 21, queries, 32, torch.device("cpu"))
    torch.testing.assert_close(attend(q, kp, vp, padded), attend(q, k, v, mask), rtol=1e-12, atol=1e-12)


def test_the_mask_is_causal_over_the_new_tokens_only() -> None:
    mask = verification_mask(1, 2, 3, 16, torch.device("cpu"))[0, 0]
    assert mask.sum(dim=1).tolist() == [3, 4, 5] and not mask[:, 5:].any()


def test_the_command_times_every_path_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    rows = main(["--preset", "tiny", "--device", "cpu", "--contexts", "0,64", "--queries", "1,3",
                 "--repeats", "2"])
    assert [(r["context_tokens"], r["query_tokens"]) for r in rows] == [(0, 1), (0, 3), (64, 1), (64, 3)]
    for row in rows:
        assert all(row[f"{name}_ms"] > 0 and row[f"{name}_max_abs_diff"] < 1e-5 for name in PATHS)
    out = capsys.readouterr().out
    assert "tiny attention, 4 requests, cpu" in out and "folded_pad16" in out
    with pytest.raises(SystemExit):
        main(["--preset", "tiny", "--device", "cpu", "--queries", "0"])
