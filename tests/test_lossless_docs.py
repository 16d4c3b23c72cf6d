"""docs/lossless.md shows examples with their output; each output must be the true one."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "lossless.md"
EXAMPLES = ["## Appendix A as it runs in the project", "## Two requests peeking at each other"]


@pytest.mark.parametrize("heading", EXAMPLES, ids=["appendix_a", "cross_request"])
def test_example_prints_what_the_page_says(heading):
    text = DOC.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    section = text[start:end if end >= 0 else len(text)]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    shown = re.search(r"```text\n(.*?)```", section, re.DOTALL)
    assert code and shown, f"docs/lossless.md: expected a python block and a text block under {heading!r}"
    printed = io.StringIO()
    module = types.ModuleType("lossless_doc_example")  # a real module: the example defines a dataclass
    sys.modules[module.__name__] = module
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code.group(1), str(DOC), "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    assert printed.getvalue() == shown.group(1)
