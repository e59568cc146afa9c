"""A comparison shown to a user: printed in a format, with the extras asked for, and its
exit status. ``lorabench compare`` and ``lorabench ab`` both end here, so the same result
reads the same and gates the same from either.

Beside ``compare`` and ``report``, not inside ``compare``, because the page it may write,
``lorabench.analysis.report.comparison``, is itself drawn from ``render``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lorabench.analysis.compare.analysis import Comparison
from lorabench.analysis.compare.render import RENDERERS, plot, render_by_rank


def show_comparison(
    result: Comparison,
    fmt: str = "text",
    *,
    plot_to: Path | None = None,
    by_rank: bool = False,
    report: Path | None = None,
) -> int:
    """Print ``result`` as ``fmt`` (text, markdown, csv or json) on stdout, draw the ratio
    plot and the report page where asked (their paths on stderr, so stdout stays one
    format); 1 when the comparison fails a gate, else 0."""
    print(RENDERERS[fmt](result))
    if plot_to is not None:
        plot(result, Path(plot_to))
        print(f"plot: {plot_to}", file=sys.stderr)
    if by_rank:
        print(render_by_rank(result))
    if report is not None:
        from lorabench.analysis.report.comparison import write_comparison_report

        print(f"report: {write_comparison_report(result, Path(report))}", file=sys.stderr)
    return 1 if result.failed else 0
