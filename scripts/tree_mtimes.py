#!/usr/bin/env python3
"""Lets a new clone reuse the build an earlier clone of the same sources left in the target directory.

Cargo decides whether our own crates are up to date from modification times: every file of a
fresh clone is newer than every artifact, so each CI run (always a new clone) recompiled every
workspace crate, about 7 minutes, although not a line had changed.

  record   after a build: writes, beside the artifacts, each tracked file's content hash (git's
           blob id) and modification time.
  restore  before a build, in any clone: gives every tracked file whose content equals the
           recorded content the recorded time. Cargo then sees exactly what it saw in the
           recorded clone: a file whose content differs keeps its checkout time, newer than every
           artifact, and what depends on it is rebuilt.

Restoring is sound only while the artifacts still come from the recorded sources. A build of any
workspace crate after the record (another clone, another branch, a build by hand) writes its
fingerprint files after the record's time; `restore` then changes nothing and says why (the build
recompiles our crates, as it would without this script). Files with uncommitted changes are
neither recorded nor restored: `restore` gives them the current time instead. Cargo's dep-info
names a workspace's files relative to its root, so a build of another clone into the same target
directory (CI's fresh clone) makes a file edited here before that build look older than the
artifacts built from the other clone's version of it — the edit would silently not be compiled.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

RECORD = "contrail-tree-mtimes.json"


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", "/var/tmp/contrail-target"))


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def tracked_clean_files() -> dict[str, str]:
    """Tracked files whose worktree content is the index's: path -> blob id."""
    changed = set(
        path
        for path in git("diff", "--name-only", "-z").split("\0")
        if path
    )
    files = {}
    for entry in git("ls-files", "-s", "-z").split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        mode, blob, _stage = meta.split()
        if mode.startswith("120") or path in changed or not os.path.isfile(path):
            continue  # symlinks, modified or deleted files
        files[path] = blob
    return files


def workspace_packages() -> list[str]:
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [package["name"] for package in json.loads(out)["packages"]]


def built_after(since_ns: int) -> str | None:
    """A fingerprint file of a workspace crate written after `since_ns`, if any (any profile)."""
    target = target_dir()
    fingerprint_dirs = [p for p in target.glob("*/.fingerprint")] + [
        p for p in target.glob("*/*/.fingerprint")
    ]
    for package in workspace_packages():
        for fingerprints in fingerprint_dirs:
            for unit in fingerprints.glob(f"{package}-*"):
                for item in [unit, *unit.iterdir()]:
                    if item.stat().st_mtime_ns > since_ns:
                        return str(item)
    return None


def record() -> None:
    files = {
        path: [blob, os.stat(path).st_mtime_ns] for path, blob in tracked_clean_files().items()
    }
    target = target_dir()
    target.mkdir(parents=True, exist_ok=True)
    temporary = target / (RECORD + ".tmp")
    temporary.write_text(json.dumps({"files": files}))
    temporary.replace(target / RECORD)
    print(f"tree_mtimes: recorded {len(files)} files in {target / RECORD}")


def uncommitted_files() -> list[str]:
    """Files whose worktree content is not HEAD's (staged or not), and untracked ones."""
    changed = git("diff", "HEAD", "--name-only", "-z").split("\0")
    untracked = git("ls-files", "--others", "--exclude-standard", "-z").split("\0")
    return [path for path in changed + untracked if path and os.path.isfile(path)]


def touch_uncommitted() -> None:
    files = uncommitted_files()
    for file in files:
        os.utime(file)
    if files:
        print(f"tree_mtimes: {len(files)} files with uncommitted changes take the current time")


def restore() -> None:
    touch_uncommitted()
    path = target_dir() / RECORD
    try:
        recorded_at = path.stat().st_mtime_ns
        files = json.loads(path.read_text())["files"]
    except FileNotFoundError:
        print("tree_mtimes: no record yet; our crates build from scratch")
        return
    except (OSError, ValueError, KeyError) as error:
        print(f"tree_mtimes: ignoring the unreadable record {path}: {error}")
        return
    same: dict[str, int] = {}
    differ = 0
    for file, blob in tracked_clean_files().items():
        entry = files.get(file)
        if entry is None or entry[0] != blob:
            differ += 1
        else:
            same[file] = entry[1]
    if all(os.stat(file).st_mtime_ns == mtime for file, mtime in same.items()):
        print(f"tree_mtimes: {len(same)} files carry their recorded times already, {differ} are new or changed")
        return
    newer = built_after(recorded_at)
    if newer is not None:
        print(f"tree_mtimes: not restoring: {newer} was built after the record")
        return
    for file, mtime in same.items():
        os.utime(file, ns=(mtime, mtime))
    print(f"tree_mtimes: {len(same)} files take their recorded times, {differ} are new or changed")


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in ("record", "restore"):
        print(__doc__.strip(), file=sys.stderr)
        print("\nusage: tree_mtimes.py record|restore (in the clone's root)", file=sys.stderr)
        return 2
    record() if sys.argv[1] == "record" else restore()
    return 0


if __name__ == "__main__":
    sys.exit(main())
