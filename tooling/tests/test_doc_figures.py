"""The docs' generated figures (tooling/doc_figures.py): every block is what its committed JSON renders today, and a
hand-edited figure is caught."""
import json
import os

import pytest

from specar.tooling import doc_figures

ROOT = doc_figures.ROOT  # the checkout
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                              if f.endswith(".md"))


@pytest.mark.parametrize("doc", DOCS)
def test_figures_equal_their_json(doc):
    """Every generated block (tooling/doc_figures.py) is what its committed JSON renders today."""
    stale = doc_figures.stale_blocks(doc)
    assert not stale, "\n".join(stale) + "\nrun: python tooling/doc_figures.py"


def test_a_hand_edited_figure_is_caught(tmp_path, monkeypatch):
    figures = doc_figures  # its ROOT is patched below (monkeypatch undoes it)
    run = {"meta": {"command": "python -m specar bench", "date": "2026-11-28", "wall_s": 1.0},
           "rows": [{"label": "ar", "nfe": 255.0, "step_compression": 1.0, "step_compression_total": 1.0}]}
    (tmp_path / "docs").mkdir()
    (tmp_path / "run.json").write_text(json.dumps(run))
    monkeypatch.setattr(figures, "ROOT", str(tmp_path))
    good = "<!-- figures: bench-counts run.json -->\n" + figures.render("bench-counts", "run.json") + \
        "<!-- end figures -->\n"
    (tmp_path / "GOOD.md").write_text(good)
    (tmp_path / "BAD.md").write_text(good.replace("255.0", "250.0"))
    assert figures.stale_blocks("GOOD.md") == []
    assert len(figures.stale_blocks("BAD.md")) == 1
