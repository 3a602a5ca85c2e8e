"""docs/claims.md is exactly what eval/claims.py writes from the committed JSON, and every row names data that
exists."""

import re

from eval import claims


def test_claims_page_is_regenerated_from_the_data():
    assert (claims.ROOT / claims.OUTPUT).read_text() == claims.render(), "run: python -m eval.claims"


def test_every_row_names_existing_data():
    text = claims.render()
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.endswith("] |")]
    sources = dict(re.findall(r"^(\d+)\. `([^`]+)`", text, flags=re.MULTILINE))
    assert len(rows) >= 10 and sources
    for line in rows:
        path = sources[re.findall(r"\[(\d+)\] \|$", line)[0]]
        assert list(claims.ROOT.glob(path)), path
