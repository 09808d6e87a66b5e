"""Issue #67, low item: the pipeline loader and the YAML writer share one set of characters that may stand only
inside a quoted string (trtflow/yaml_text.py `UNSAFE_OUTSIDE_QUOTES`), and `trtflow output` refuses an output it does
not have before it says anything else."""
from __future__ import annotations

import pytest

from trtflow.errors import SpecError
from trtflow.pipelines.loader import load_text
from trtflow.yaml_text import UNSAFE_OUTSIDE_QUOTES, quoted

PIPE = 'version: 1\nname: marks{mark}\nmodel: m.onnx\nstages:\n  p: {{kind: prepare}}\n'


@pytest.mark.parametrize("mark", ["\u200e", "\u200f", "\u061c", "\ufeff", "\u2028", "\u202e"])
def test_a_mark_the_writer_escapes_is_refused_outside_quotes(tmp_path, mark):
    assert mark not in quoted(f"a{mark}")  # the writer escapes it
    with pytest.raises(SpecError, match=f"U\\+{ord(mark):04X}") as exc:
        load_text(PIPE.format(mark=mark), tmp_path / "pipeline.yaml", check_files=False)
    assert exc.value.line == 2


def test_every_character_the_loader_refuses_outside_quotes_is_one_the_writer_escapes():
    import re

    for ch in re.findall(".", re.sub(r"(.)-(.)", lambda m: "".join(chr(c) for c in range(ord(m[1]), ord(m[2]) + 1)),
                                     UNSAFE_OUTSIDE_QUOTES), flags=re.S):
        assert ch not in quoted(ch), f"U+{ord(ch):04X}"


@pytest.mark.slow
def test_a_mark_inside_a_quoted_value_is_data_and_a_leading_bom_is_an_editors(tmp_path):
    loaded = load_text('\ufeffversion: 1\nname: ab\nmodel: "m\u200e.onnx"\nstages:\n  p: {kind: prepare}\n',
                       tmp_path / "pipeline.yaml", check_files=False)
    assert loaded.spec.model == "m\u200e.onnx"
