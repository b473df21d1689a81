"""A command group whose ``--help`` lists each command with its whole description."""

from __future__ import annotations

import sys

import click


class Group(click.Group):
    """click cuts each command's line in the listing to what fits beside the longest name
    ("into the..."); here the line is the command's whole first sentence (its
    ``short_help``, if any), wrapped under itself instead."""

    # Groups made with ``@group.group()`` are of this class too.
    group_class = type

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=sys.maxsize)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

