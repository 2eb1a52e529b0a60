"""Write the audit's report folder: the page, `numbers.json` and the Parquet tables."""

from __future__ import annotations

from pathlib import Path

from .._runner import Audit
from ._numbers import summary, write_numbers
from ._page import render


def write_report(audit: Audit, out: str | Path) -> Path:
    """Write the audit into folder `out` (created if needed) and return the path of `report.html`.

    `out` receives `report.html` (one self-contained page: inline CSS, figures as PNG data URIs,
    no external URL), `numbers.json` (every summary number, NaN as null, plus `tables`: the
    Parquet files with their rows and columns) and one `<table>.parquet` per table (see
    `rewardlens.audit.report.tables`). Existing files of the same names are replaced.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    numbers = summary(audit)
    written = write_numbers(audit, out, numbers)
    page = out / "report.html"
    files = [t["file"] for t in written["tables"].values()]
    # Write then rename: a reader (or a crash) never sees half a page.
    tmp = out / "report.html.tmp"
    tmp.write_text(render(audit, numbers, files), encoding="utf-8")
    tmp.replace(page)
    return page
