"""Training the byte-level target and drafters: forwards match inference, losses, corpora, a few-step smoke run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from calibration.acceptance.evaluate import decode_and_record, prompt_lengths
from calibration.acceptance.evaluate import main as evaluate_main
from calibration.models import checkpoints
from calibration.models.presets import BYTE_SHAPE, DRAFTER_CONFIGS
from calibration.training.corpora import decode, encode, load_corpus, math_corpus, sample_prompts, sample_windows
from calibration.training.teacher_forcing import BlockPrediction, drafter_forward, target_forward
from calibration.training.train import TrainConfig, drafter_losses, main, position_weights, train_drafter, train_target
from simulator.acceptance.logs import to_blocks, validate

GAMMA = 7


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def sharp(module: torch.nn.Module) -> torch.nn.Module:
    """Scale random matrices up so that distributions are far from uniform and mismatches would show."""
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.mul_(5.0)
    return module


@pytest.fixture(scope="module")
def target():
    return sharp(checkpoints.new_target(torch.Generator().manual_seed(1)))


def test_target_forward_matches_the_cached_verifier(target):
    tokens = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(2))
    cache = target.new_cache(1, 40)
    with torch.no_grad():
        ref = target(tokens[0], cache.batch([0], [40]), cache)
        out = target_forward(target, tokens)
    torch.testing.assert_close(out.logits[0], ref.logits)
    torch.testing.assert_close(out.features[0], ref.features)


@pytest.mark.parametrize("kind", list(DRAFTER_CONFIGS))
def test_drafter_training_forward_matches_propose(target, kind):
    """Teacher-forcing the drafted tokens reproduces the proposal distributions and confidences of inference."""
    drafter = sharp(checkpoints.new_drafter(DRAFTER_CONFIGS[kind], target,
                                            torch.Generator().manual_seed(3)))
    tokens = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(4))
    n = 20  # anchor position: the context is tokens[:n]
    with torch.no_grad():
        cache = target.new_cache(1, 40)
        context = target(tokens[0, :n], cache.batch([0], [n]), cache)
        drafter.new_cache(1, 40)
        drafter.extend_context([0], drafter.features_of(context), [n])
        draft = drafter.propose(tokens[0, n:n + 1], torch.tensor([0]), GAMMA, torch.Generator().manual_seed(5))
        forced = tokens.clone()
        forced[0, n + 1:n + 1 + GAMMA] = draft.tokens[0]
        pred = drafter_forward(drafter, target_forward(target, forced), forced, torch.tensor([[n]]), GAMMA)
    torch.testing.assert_close(torch.softmax(pred.logits[0, 0], -1), draft.probs[0], atol=1e-5, rtol=1e-4)
    if draft.confidence is not None:
        torch.testing.assert_close(pred.confidence[0, 0], draft.confidence[0], atol=1e-5, rtol=1e-4)


def test_position_weights_and_losses_at_a_perfect_drafter():
    np.testing.assert_allclose(position_weights(7).numpy(), np.exp(-np.arange(7) / 7), rtol=1e-6)
    logits = torch.randn(2, 3, GAMMA, 16, generator=torch.Generator().manual_seed(0))
    perfect = drafter_losses(BlockPrediction(logits, torch.full((2, 3, GAMMA), 0.999)), logits,
                             torch.zeros(2, 3, GAMMA, dtype=torch.long))
    assert float(perfect.tv) == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(perfect.acceptance, torch.ones(GAMMA))  # soft label 1 - TV = 1
    worse = drafter_losses(BlockPrediction(-logits, torch.full((2, 3, GAMMA), 0.999)), logits,
                           torch.zeros(2, 3, GAMMA, dtype=torch.long))
    assert float(worse.tv) > 0.5 and float(worse.conf) > float(perfect.conf)


@pytest.mark.slow  # ~6 s: the training corpora built in full
def test_corpora_are_ascii_seeded_and_split():
    assert encode("naïve") .tolist() == [ord(c) for c in "na??ve"]  # the two UTF-8 bytes of i-diaeresis
    assert decode(encode("x = 1\n")) == "x = 1\n"
    train, again, held = math_corpus("train"), math_corpus("train"), math_corpus("heldout")
    np.testing.assert_array_equal(train.tokens, again.tokens)
    assert decode(held.tokens[:200]) not in decode(train.tokens)
    assert decode(train.tokens[:9]) == "Question:"
    prompts = sample_prompts(held, 5, 32, np.random.default_rng(0))
    assert all(len(p) == 32 for p in prompts)
    windows = sample_windows([train, held], 4, 16, np.random.default_rng(0))
    assert windows.shape == (4, 16) and windows.max() < 128


def test_prompt_lengths_are_fixed_at_sigma_0_and_lognormal_within_4x_the_median_otherwise(capsys):
    assert prompt_lengths(96, 0.0, 5, np.random.default_rng(0)) == 96  # nothing drawn: the old prompts, exactly
    lengths = prompt_lengths(96, 0.8, 2000, np.random.default_rng(0))
    again = prompt_lengths(96, 0.8, 2000, np.random.default_rng(0))
    np.testing.assert_array_equal(lengths, again)
    assert lengths.min() >= 1 and lengths.max() == 4 * 96  # exp(0.8 z) > 4 for z > 1.73: some draws truncated
    assert abs(np.median(lengths) / 96 - 1) < 0.1  # 4.5 standard errors of the median (2.2%)
    prompts = sample_prompts(math_corpus("heldout"), 4, np.array([5, 40, 17, 1]), np.random.default_rng(1))
    assert [len(p) for p in prompts] == [5, 40, 17, 1]
    with pytest.raises(SystemExit):
        evaluate_main(["--prompt-sigma", "-0.5"])
    assert "--prompt-sigma must be >= 0 (0: fixed lengths), got -0.5" in capsys.readouterr().err


def test_training_smoke_and_checkpoint_round_trip(tmp_path):
    corpora = [load_corpus("math", "train")]
    config = TrainConfig(steps=3, batch_sequences=2, window_tokens=48, anchors_per_sequence=4)
    losses: list[float] = []
    target = train_target(corpora, config, lambda step, loss: losses.append(loss))
    assert len(losses) == 3 and all(np.isfinite(losses))
    checkpoints.save(target, tmp_path / "target.pt", {"shape": BYTE_SHAPE.name})
    loaded = checkpoints.load_target(tmp_path)
    tokens = torch.from_numpy(sample_windows(corpora, 1, 32, np.random.default_rng(0)))
    with torch.no_grad():
        torch.testing.assert_close(target_forward(loaded, tokens).logits, target_forward(target, tokens).logits,
                                   atol=0.05, rtol=0.05)  # fp16 weights
    for kind, spec in DRAFTER_CONFIGS.items():
        seen: list[float] = []
        drafter = train_drafter(kind, target, corpora, config, lambda s, loss, seen=seen: seen.append(loss))
        assert len(seen) == 3 and all(np.isfinite(seen))
        size = checkpoints.save(drafter, tmp_path / f"{kind}.pt", {"config": spec.__dict__})
        assert size < 2_000_000  # shippable
        assert checkpoints.load_drafter(kind, loaded, tmp_path).kind == kind


def test_train_command_writes_checkpoints_and_manifest(tmp_path, capsys):
    main(["--domain", "math", "--steps", "2", "--models", "target,dspark", "--out", str(tmp_path),
          "--batch-sequences", "2", "--threads", "1"])
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert set(manifest["models"]) == {"target", "dspark"}
    assert len(manifest["heldout"]["math"]["dspark_teacher_forced_acceptance"]) == GAMMA
    assert (tmp_path / "target.pt").exists() and (tmp_path / "dspark.pt").exists()


def test_recorded_log_matches_the_analytic_acceptance(target):
    """The hook's analytic acceptance 1 - TV predicts the sampled outcomes (position 1 has no selection)."""
    drafter = sharp(checkpoints.new_drafter(DRAFTER_CONFIGS["dspark"], target,
                                            torch.Generator().manual_seed(6)))
    prompts = sample_prompts(math_corpus("heldout"), 48, 16, np.random.default_rng(1))
    df = decode_and_record(target, drafter, prompts, 24, GAMMA, "math", np.random.default_rng(2),
                           torch.Generator().manual_seed(3))
    validate(df)
    blocks = to_blocks(df)
    assert (blocks.num_verified == GAMMA).all()
    assert not np.isnan(blocks.confidence).any() and not np.isnan(blocks.analytic_acceptance).any()
    hit = (blocks.num_accepted >= 1).astype(float)
    se = hit.std() / np.sqrt(hit.size)
    assert hit.mean() == pytest.approx(blocks.analytic_acceptance[:, 0].mean(), abs=4 * se + 0.01)
    assert 0.05 < hit.mean() < 0.95  # sharp random weights: a real mix of accepts and rejects


def test_dense_recording_has_a_block_at_every_position(target, tmp_path):
    """max_kept_tokens=1 (evaluate --dense): per request, blocks at positions 0..n-1, walked in order on replay."""
    from simulator.acceptance.logs import write_log
    from simulator.acceptance.replay import LoggedAcceptance

    drafter = sharp(checkpoints.new_drafter(DRAFTER_CONFIGS["dspark"], target,
                                            torch.Generator().manual_seed(6)))
    prompts = sample_prompts(math_corpus("heldout"), 6, 16, np.random.default_rng(1))
    lengths = np.array([5, 9, 12, 5, 7, 3])
    df = decode_and_record(target, drafter, prompts, lengths, GAMMA, "math", np.random.default_rng(2),
                           torch.Generator().manual_seed(3), max_kept_tokens=1)
    blocks = to_blocks(df)
    for rid, n in enumerate(lengths):
        assert blocks.decoded_tokens[blocks.request_id == rid].tolist() == list(range(n))
    assert (blocks.num_verified == GAMMA).all() and blocks.num_accepted.max() > 1
    assert LoggedAcceptance(write_log(df, tmp_path / "dense.parquet")).order == "walk"
