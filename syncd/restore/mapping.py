"""The rules a restore maps paths with: ``build_remapper`` (explicit rules, what a pass
learned, git remotes, worktrees, the Claude tree and home) and the project folders they
move; where a stored path lands in the target, and which files are rewritten.
"""

from __future__ import annotations

import os

from syncd.claude import project_folder
from syncd.format.catalog import Session
from syncd.gitinfo import find_clones, normalize_remote, project_info
from syncd.restore.options import RestoreOptions
from syncd.restore.origin import Pass
from syncd.restore.relocation import launch_dir, placed_by
from syncd.restore.remap import Remapper, Rule
from syncd.view import Backup

WORKTREE_MARK = "/.claude/worktrees/"


def build_remapper(backup: Backup, opts: RestoreOptions, step: Pass | None = None,
                   clones: dict[str, str] | None = None) -> Remapper:
    """Explicit rules, what ``step`` learned of this machine's copies and the sessions'
    origins (``restore/origin``), then git-remote matches (``clones``: the local ones by
    remote, when already looked for) and worktrees, then the Claude tree and home."""
    learned = step or Pass()
    rules: list[Rule] = [*learned.rules, *opts.maps]
    home = backup.info.get("home")
    homes = [Rule(home, opts.local_home, "home")] if isinstance(home, str) else []
    if opts.project_roots:
        if clones is None:
            clones = find_clones(list(opts.project_roots))
        for info in backup.projects.values():
            remote, top = info.get("remote"), info.get("toplevel")
            local = clones.get(normalize_remote(remote)) if remote else None
            if local and top and not any(_under(top, r.old) for r in opts.maps):
                rules.append(Rule(top, local, f"same git remote ({remote})"))
    pre = Remapper([*rules, *homes])
    for info in backup.projects.values():
        main = info.get("main")
        for wt in info.get("worktrees", [])[1:]:
            path = wt.get("path")
            if not main or not path or any(_under(path, r.old) for r in opts.maps):
                continue
            new_main = pre.path(main)
            if opts.worktrees == "fold":
                rules.append(Rule(path, new_main, "worktree folded into its main checkout"))
            elif not _under(path, main):
                local = _local_worktree(new_main, wt.get("branch"))
                if local:
                    rules.append(Rule(path, local, f"worktree of branch {wt.get('branch')}"))
    if opts.worktrees == "fold":
        for s in backup.sessions.values():
            for cwd in (s.project or "", s.fields.get("relocated_cwd") or ""):
                if WORKTREE_MARK in cwd.replace("\\", "/"):
                    main = cwd[: cwd.replace("\\", "/").index(WORKTREE_MARK)]
                    rules.append(Rule(cwd, pre.path(main),
                                      "worktree folded into its main checkout"))
    root = backup.info.get("claude_root")
    if opts.local_root and isinstance(root, str):
        rules.append(Rule(root, opts.local_root, "Claude tree"))
    if isinstance(home, str):
        rules.append(Rule(home, opts.local_home, "home"))
    remap = Remapper(rules)
    return Remapper(remap.rules, {**_folders(backup, remap), **learned.folders})


def _under(path: str, prefix: str) -> bool:
    p, q = path.replace("\\", "/").rstrip("/"), prefix.replace("\\", "/").rstrip("/")
    return p == q or p.startswith(q + "/")


def _local_worktree(main: str, branch: str | None) -> str | None:
    if not branch:
        return None
    info = project_info(main)
    for wt in (info or {}).get("worktrees", []):
        if wt.get("branch") == branch:
            return str(wt["path"])
    return None


def _launched(s: Session) -> tuple[str, str] | None:
    """The directory ``s``'s folder is named by, and how (``relocation.launch_dir``): its
    last relocatedCwd's, which Claude derives the folder from, else its start's."""
    cwd = placed_by(s)
    found = launch_dir(s.folder, cwd) if cwd else None
    if found is None and s.fields.get("relocated_cwd"):
        return s.fields["relocated_cwd"], "exact"
    return found


def _folders(backup: Backup, remap: Remapper) -> dict[str, str]:
    """Old project folder → new one, only where the rules move the start directory."""
    folders: dict[str, str] = {}
    for s in sorted(backup.sessions.values(), key=lambda s: s.path):
        found = _launched(s)
        if found is not None and s.folder not in folders:
            start, how = found
            moved = remap.path(start)
            # Named by this machine's rule, also where the path stays (a variant name is
            # where this CLI never looks); but a long name's other hash suffix stays where
            # the path does: Claude finds it by its prefix, which does not say whether the
            # start was this directory or one above.
            folders[s.folder] = s.folder if how == "prefix" and moved == start else \
                project_folder(moved)
    prefixes = [(project_folder(r.old), project_folder(r.new)) for r in remap.rules]
    for path in backup.files:
        parts = path.split(b"/")
        if len(parts) < 3 or parts[0] != b"projects":
            continue
        name = os.fsdecode(parts[1])
        if name in folders:
            continue
        for old, new in prefixes:
            if len(name) <= 200 and (name == old or name.startswith(old + "-")):
                folders[name] = new + name[len(old):]
                break
    return folders


def _kind(rel: bytes) -> str:
    if rel == b"history.jsonl":
        return "history"
    if rel.startswith(b"projects/") and rel.endswith(b".jsonl"):
        return "transcript"
    return "file"


def _remapped(rel: bytes) -> bool:
    """Files whose paths are rewritten: transcripts, history, projects' JSON metadata, and
    saved tool output (its preview in the transcript is rewritten too)."""
    return rel == b"history.jsonl" or (rel.startswith(b"projects/") and (
        rel.endswith((b".jsonl", b".json")) or b"/tool-results/" in rel))


def _target_rel(rel: bytes, remap: Remapper) -> bytes:
    parts = rel.split(b"/")
    if len(parts) >= 3 and parts[0] == b"projects":
        parts[1] = os.fsencode(remap.folder(os.fsdecode(parts[1])))
    return b"/".join(parts)
