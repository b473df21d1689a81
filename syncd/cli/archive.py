"""Commands that keep the archive: compact, prune, verify."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from syncd.cli.table import Column, Table, wide_option
from syncd.cli.util import (
    duration_option,
    echo_json,
    repository_of,
    settings_of,
    source_option,
)
from syncd.progress import meter

if TYPE_CHECKING:
    from syncd.archive.compact import CompactReport
    from syncd.archive.prune import PruneReport

# What a command needs is imported inside it (see syncd.cli.main).


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _summary(r: CompactReport) -> str:
    if r.delta is not None:
        return (f"{r.machine}: {r.segments} segments ({_mb(r.segment_bytes)}) folded into "
                f"delta {r.delta}, every flush a point; {len(r.deleted)} objects deleted")
    if r.snapshot is None:
        return f"{r.machine}: {r.note or 'nothing written'}"
    packs = sum(s for _, s in r.packs_written)
    return (f"{r.machine}: {r.segments} segments ({_mb(r.segment_bytes)}) and "
            f"{len(r.packs_merged)} packs rewritten into {len(r.packs_written)} packs "
            f"({_mb(packs)}); snapshot {r.snapshot}; {len(r.deleted)} objects deleted")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _prune_summary(r: PruneReport) -> str:
    """What a dry run of prune would do, in one line (its compaction's own words, "dry
    run: nothing written" or "nothing to compact", say nothing of the prune)."""
    c, folded = r.compaction, r.folded
    steps = []
    if folded is not None and folded.segments:
        steps.append(f"compact {_count(folded.segments, 'segment')} first")
    if r.forgotten:
        steps.append(f"forget {_count(len(r.forgotten), 'snapshot')}")
    if r.dropped:
        steps.append(f"drop {_count(len(r.dropped), 'delta')}")
    if c is not None and c.packs_merged:
        steps.append(f"rewrite {_count(len(c.packs_merged), 'pack')} "
                     f"({_mb(c.raw_bytes)} of data)")
    if not steps:
        return f"{r.machine}: would delete nothing (the policy keeps every snapshot)"
    return f"{r.machine}: would {', '.join(steps)}"


@click.command("compact", short_help="Fold segments into a delta, or packs and a manifest.")
@click.option("--dry-run", is_flag=True, help="Say what would be compacted; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@source_option
@click.pass_context
def compact_cmd(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Fold this machine's segments since the last compaction into a delta that keeps
    every flush as a point in time; every max_deltas deltas, into packs and a snapshot
    manifest instead.

    Exit 0 when done (or nothing to do), 1 when it could not run or stopped partway
    (nothing is deleted then).
    """
    from syncd.archive.compact import compact
    from syncd.archive.options import compact_options, ensure_dictionary, record_job

    settings = settings_of(ctx)
    repo = repository_of(settings)
    opts = compact_options(settings, dry_run=dry_run)
    note = None if dry_run else ensure_dictionary(settings, repo)
    with meter("compacting") as m:
        opts.progress = m
        r = compact(repo, opts)
    if not dry_run:
        record_job(settings, "compaction")
    if as_json:
        echo_json({**r.as_dict(), "dictionary": note})
    else:
        if note:
            click.echo(note)
        click.echo(_summary(r) if not dry_run else
                   f"{r.machine}: would compact {r.segments} segments "
                   f"({_mb(r.segment_bytes)}) and rewrite {len(r.packs_merged)} packs"
                   f"{'' if r.note.startswith('dry') else ' (' + r.note + ')'}")
        for w in r.errors:
            click.echo(f"warning: {w}", err=True)


# prune's verdict on each snapshot: kept, forgotten, or left for the next run.
VERDICT_COLUMNS = (Column("VERDICT"), Column("SNAPSHOT"), Column("SEQ", right=True),
                   Column("WHY", cut="end"))


@click.command("prune", short_help="Delete the snapshots the retention policy lets go.")
@click.option("--dry-run", is_flag=True,
              help="Print what would be deleted and why each kept snapshot is kept.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@wide_option
@source_option
@click.pass_context
def prune_cmd(ctx: click.Context, dry_run: bool, as_json: bool, wide: bool) -> None:
    """Delete snapshots the retention policy does not keep, then reclaim their data.

    The policy comes from the config (keep_within, keep_last, keep_hourly, keep_daily,
    keep_weekly, keep_monthly; all zero keeps everything). The newest snapshot is never
    deleted; a policy that keeps nothing by itself is refused. Exit 0 done, 1 refused
    or failed.
    """
    from syncd.archive.options import compact_options, policy_of, record_job
    from syncd.archive.prune import prune

    settings = settings_of(ctx)
    repo = repository_of(settings)
    opts = compact_options(settings, dry_run=dry_run)
    with meter("pruning") as m:
        opts.progress = m
        r = prune(repo, policy_of(settings), max_share=settings.prune_max_share, opts=opts)
    if not dry_run:
        record_job(settings, "prune")
    if as_json:
        echo_json(r.as_dict())
        return
    click.echo(f"{r.machine}: policy {r.policy}")
    if r.verdicts:
        Table(VERDICT_COLUMNS, r.verdicts, lambda v: (
            "keep" if v.keep else "forget" if v.snap.key in r.forgotten else "later",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(v.snap.time)), str(v.snap.seq),
            ", ".join(v.reasons) or "-")).echo(wide=wide)
    if r.deferred:
        click.echo(f"{len(r.deferred)} more to forget next run (prune_max_share "
                   f"{settings.prune_max_share:g})")
    if r.compaction is not None:
        click.echo(_prune_summary(r) if dry_run else _summary(r.compaction))
    for w in r.errors:
        click.echo(f"warning: {w}", err=True)


@click.command("verify", short_help="Check the backup is whole (exit 1 on any problem).")
@click.option("--machine", default=None, help="Another machine's backup (default: this one).")
@click.option("--read-data", type=click.FloatRange(0, 100), default=0.0, show_default=True,
              help="Also read and checksum this percentage of the stored data.")
@click.option("--max-duration", default=None, callback=duration_option,
              help="Stop reading data after this long (90s, 10m, 1h).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@source_option
@click.pass_context
def verify_cmd(ctx: click.Context, machine: str | None, read_data: float,
               max_duration: float | None, as_json: bool) -> None:
    """Check that the backup is whole: manifests, objects, seq ranges, sampled checksums.

    Exit 0 when no problem was found, 1 when any was (each printed on one line).
    """
    from syncd.archive.options import acknowledged_seq, record_job
    from syncd.archive.verify import verify

    settings = settings_of(ctx)
    repo = repository_of(settings, machine)
    mine = repo.machine == settings.machine_id
    with meter("verifying") as m:
        r = verify(repo, read_data=read_data, max_duration=max_duration, progress=m,
                   acknowledged=acknowledged_seq(settings) if mine else None,
                   head_interval=settings.head_interval)
    if r.ok and mine:
        record_job(settings, "verify")
    if as_json:
        echo_json(r.as_dict())
    else:
        for p in r.problems:
            click.echo(f"problem: {p}")
        click.echo(f"{r.machine}: {r.snapshots} snapshots, {r.packs} packs, {r.segments} "
                   f"segments checked; {r.extents_read} extents read ({_mb(r.bytes_read)}, "
                   f"{100 * r.sampled_share:.1f} % of the data"
                   f"{', stopped at --max-duration' if r.stopped_early else ''}); "
                   f"{len(r.problems) or 'no'} problems")
        if r.unreferenced:
            click.echo(f"note: {len(r.unreferenced)} unreferenced packs (left by an "
                       "interrupted run; the next compaction deletes them)")
    if not r.ok:
        raise SystemExit(1)


COMMANDS = (compact_cmd, prune_cmd, verify_cmd)
