"""docs/lossless.md shows the Appendix A example with its output; the output must be the true one."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "lossless.md"


def test_appendix_a_example_prints_what_the_page_says():
    text = DOC.read_text()
    section = text[text.index("## Appendix A as it runs in the project"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    shown = re.search(r"```text\n(.*?)```", section, re.DOTALL)
    assert code and shown, "docs/lossless.md: expected a python block and a text block in the Appendix A section"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.group(1), str(DOC), "exec"), {})
    assert printed.getvalue() == shown.group(1)
