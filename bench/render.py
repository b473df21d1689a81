#!/usr/bin/env python3
"""Rendering speed of `syncd show` (issue 27): the real sample transcripts (their
subagents included) parsed and rendered as HTML, Markdown and terminal text, in MB of
transcript per CPU second.

    .venv/bin/python bench/render.py            # 7 runs each
    .venv/bin/python bench/render.py --runs 15

Each run reads every sample from disk and renders it (everything shown: thinking and
tool results); "html, render only" renders transcripts parsed beforehand (the part of
"html (document)" past "parse only"). The forms' runs are interleaved (parse, html, md,
text, parse, …) so the machine's load weighs on all alike. Figures: median MB/s of
process CPU time (user+sys) with (min-max). Asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from syncd.render import transcript as tr  # noqa: E402
from syncd.render.html import html_document  # noqa: E402
from syncd.render.markdown import to_markdown  # noqa: E402
from syncd.render.text import print_text  # noqa: E402

SAMPLES = REPO.parent / "shared" / "claude-samples"


def _text(t: tr.Transcript) -> str:
    from rich.console import Console

    out = io.StringIO()
    print_text(t, Console(file=out, width=120, force_terminal=True), with_thinking=True,
               with_tools=True, page=False)
    return out.getvalue()


def _render_only(t: tr.Transcript) -> None:  # (a marker: ``once`` renders parsed ones)
    pass


FORMS: dict[str, Callable[[tr.Transcript], object]] = {
    "parse only": lambda t: None,
    "html (document)": lambda t: html_document(t, with_thinking=True, with_tools=True),
    "html, render only": _render_only,
    "markdown": lambda t: to_markdown(t, with_thinking=True, with_tools=True),
    "text (rich)": _text,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--samples", type=Path, default=SAMPLES)
    args = ap.parse_args()
    paths = sorted(args.samples.glob("*/projects/*/*.jsonl"))
    if not paths:
        sys.exit(f"no samples under {args.samples}")
    size = sum(p.stat().st_size for p in args.samples.rglob("*.jsonl"))

    def load(p: Path) -> tr.Transcript:
        root = p.parents[2]
        return tr._local(root, p.stem, os.fsencode(p.relative_to(root)), "bench")

    parsed = [load(p) for p in paths]

    def once(render: Callable[[tr.Transcript], object]) -> float:
        start = time.process_time()
        if render is _render_only:
            for t in parsed:
                html_document(t, with_thinking=True, with_tools=True)
        else:
            for p in paths:
                render(load(p))
        return time.process_time() - start

    for render in FORMS.values():  # warm-up: imports, Pygments' lexers
        once(render)
    times: dict[str, list[float]] = {name: [] for name in FORMS}
    for _ in range(args.runs):
        for name, render in FORMS.items():
            times[name].append(once(render))
    print(f"{len(paths)} transcripts, {size / 1e6:.1f} MB with their subagents; "
          f"{args.runs} runs each; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for name, ts in times.items():
        rates = [size / 1e6 / t for t in ts]
        print(f"{name:17}  {statistics.median(rates):6.1f} MB/s  "
              f"({min(rates):.1f}-{max(rates):.1f})  median CPU {statistics.median(ts):.3f} s")


if __name__ == "__main__":
    main()
