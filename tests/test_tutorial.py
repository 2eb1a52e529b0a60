"""The tutorial (examples/tutorial.ipynb) runs top to bottom on the demo model in a real Jupyter kernel, and is
committed without outputs (a valid nbformat notebook a reader runs themselves)."""

from __future__ import annotations

from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[1] / "examples" / "tutorial.ipynb"
BY_HAND = Path(__file__).resolve().parents[1] / "examples" / "smollm2.ipynb"
"""The real SmolLM2 RM's notebook: run by hand (it builds a real model), so only its form is tested here."""


@pytest.mark.parametrize("path", [TUTORIAL, BY_HAND], ids=lambda p: p.name)
def test_the_notebooks_are_valid_and_committed_without_outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert nb.cells[0].cell_type == "markdown"


@pytest.mark.slow
def test_the_tutorial_runs_top_to_bottom(tmp_path):
    """Every cell runs without error (nbclient stops at the first), in a scratch folder, and the steps that show a
    result display it as HTML (the results' notebook view)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(TUTORIAL, as_version=4)
    NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    html = [c for c in nb.cells if c.cell_type == "code" and any("text/html" in o.get("data", {}) for o in c.outputs)]
    assert len(html) >= 10, f"only {len(html)} cells displayed a result's HTML view"
    assert (tmp_path / "tutorial-audit" / "report.html").is_file()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "findings" in printed and "accuracy" in printed
