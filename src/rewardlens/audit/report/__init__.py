"""The audit's report: `write_report(audit, out)` writes `report.html`, `numbers.json` and Parquet tables.

`rewardlens.audit.report.figures` holds the figures as plain functions (`fig_lens(audit)`, ...) for other
faces to reuse; `summary`, `tables` and `margins` the summary numbers and tables behind the page;
`token_section` the token section's HTML for any `TokenAttribution` of pairs; `findings` the audit's claims
(`Finding`: sentence, number, interval, pairs, strength) that open the page and `findings_text` their lines
as `rewardlens audit` prints them.
"""

from . import _figures as figures
from ._findings import Finding as Finding
from ._findings import findings as findings
from ._findings import findings_text as findings_text
from ._numbers import margins as margins
from ._numbers import plain as plain
from ._numbers import summary as summary
from ._numbers import tables as tables
from ._schema import AuditResult as AuditResult
from ._schema import AuditSummary as AuditSummary
from ._tokens import token_section as token_section
from ._write import write_report as write_report

__all__ = ["AuditResult", "AuditSummary", "Finding", "figures", "findings", "findings_text", "margins", "plain",
           "summary", "tables", "token_section", "write_report"]
