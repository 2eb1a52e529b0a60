"""Write the audit's report folder: the page, `numbers.json` and the Parquet tables."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from ...errors import warn
from .._runner import Audit
from ._graphs import graph_pages
from ._numbers import summary, write_numbers
from ._page import render
from ._schema import AuditSummary

_OWN_TABLE = re.compile(r"[A-Za-z0-9_]+\.parquet")
"""A table file rewardlens itself writes (`<table>.parquet`, no folder part): the only names it removes."""


def write_report(audit: Audit, out: str | Path, numbers: AuditSummary | None = None) -> Path:
    """Write the audit into folder `out` (created if needed) and return the path of `report.html`.

    `out` receives `report.html` (one self-contained page: inline CSS, figures as PNG data URIs,
    no external URL), `numbers.json` (every summary number, NaN as null, its `provenance`: model
    path, data file, command line, version and time, plus `tables`: the Parquet files with their
    rows and columns) and one `<table>.parquet` per table (see `rewardlens.audit.report.tables`).
    A folder holds one run: files of the same names are replaced, and the Parquet tables an
    earlier report listed in its `numbers.json` that this one does not write are removed (with a
    warning naming them), and so are the graph pages (`graphs/pair_<i>.html`) of an earlier run with
    `--graph` that this one does not write; no other file in the folder is touched. `numbers`: a `summary(audit)`
    already computed (the command line's, with its own `top`), written as it is.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    earlier = _earlier_tables(out)
    numbers = summary(audit) if numbers is None else numbers
    written = write_numbers(audit, out, numbers)
    files = [t["file"] for t in written["tables"].values()]
    stale = sorted(earlier - set(files))
    for name in stale:
        (out / name).unlink(missing_ok=True)
    if stale:
        warn(f"removed {len(stale)} table file(s) an earlier report wrote into {out} that this run does not "
             f"write: {', '.join(stale)} (an output folder holds one run)")
    page = out / "report.html"
    # Write then rename: a reader (or a crash) never sees half a page.
    tmp = out / "report.html.tmp"
    tmp.write_text(_with_provenance(render(audit, numbers, files), numbers["provenance"]), encoding="utf-8")
    tmp.replace(page)
    graph_pages(audit, out)  # each graphed pair's interactive page, linked from the page's graph section
    return page


def _earlier_tables(out: Path) -> set[str]:
    """The Parquet files the `numbers.json` already in `out` lists (an earlier report's); none if unreadable."""
    try:
        listing = json.loads((out / "numbers.json").read_text(encoding="utf-8")).get("tables") or {}
        names = {str(t.get("file")) for t in listing.values() if isinstance(t, dict)}
    except (OSError, ValueError, AttributeError):
        return set()
    return {n for n in names if _OWN_TABLE.fullmatch(n) and (out / n).is_file()}


def provenance_line(prov: dict[str, Any]) -> str:
    """One plain line: model path · data file · rewardlens version · time · command line."""
    shown = [f"model: {prov.get('model_path') or 'not recorded'}", f"data: {prov.get('data') or 'not recorded'}",
             f"rewardlens {prov.get('rewardlens_version')}", f"at {prov.get('time_utc')}"]
    if prov.get("command_line"):
        shown.append(f"command: {prov['command_line']}")
    return " · ".join(shown)


def _with_provenance(page: str, prov: dict[str, Any]) -> str:
    """The page with a provenance line under its header's title."""
    line = f'<p class="provenance">{html.escape(provenance_line(prov))}</p>'
    return page.replace("</header>", line + "</header>", 1)
