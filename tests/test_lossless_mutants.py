"""The planted-bug check (tests/mutants.py) as a test: every classic bug must be killed. Minutes: slow."""

from __future__ import annotations

import pytest

from tests import mutants


@pytest.mark.slow
def test_every_planted_bug_is_killed():
    assert mutants.main([]) == 0
