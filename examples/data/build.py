#!/usr/bin/env python3
"""Builds examples/data/debian-packages.json, the quickstart's corpus, from Debian's own
package index as apt fetches it.

    sudo apt-get update                     # once, if /var/lib/apt/lists holds no index
    python3 examples/data/build.py          # from the repository root
    python3 examples/data/build.py PATH     # or from a Packages file you name (any compression
                                            # apt-helper reads: plain, .gz, .xz, .lz4)

One JSON object a line (newline-delimited JSON, what DataFusion reads with STORED AS JSON),
one line per binary package of the sections below, in package-name order:

    {"id": 1, "package": "...", "section": "...", "description": "...", "depends": ["...", ...]}

`id` numbers the packages from 1 in that order; `description` is the package's one-line
synopsis (the first line of its Description field); `depends` the distinct names in its
Depends and Pre-Depends fields, sorted (version constraints and :arch qualifiers dropped,
every alternative of `a | b` kept). Python 3 standard library only.
"""
import glob
import json
import os
import re
import subprocess
import sys

SECTIONS = ("database", "httpd", "mail")
FIELDS = ("Pre-Depends", "Depends")
LISTS = "/var/lib/apt/lists"
# The index of Debian 12 "bookworm", main, amd64 (not -updates or -security).
DEFAULT = "*_debian_dists_bookworm_main_binary-amd64_Packages*"
NAME = re.compile(r"\s*([a-z0-9][a-z0-9+.\-]*)")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "debian-packages.json")


def read_index(path):
    """The index's text: apt's own helper decompresses whatever apt stored."""
    return subprocess.run(
        ["/usr/lib/apt/apt-helper", "cat-file", path], check=True, capture_output=True
    ).stdout.decode("utf-8", errors="replace")


def stanzas(text):
    """Each package's fields (continuation lines dropped: only first lines are used)."""
    for block in text.split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if line and not line[0].isspace():
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            yield fields


def dependencies(fields):
    names = set()
    for field in FIELDS:
        for alternative in re.split(r"[,|]", fields.get(field, "")):
            m = NAME.match(alternative)
            if m:
                names.add(m.group(1))
    return sorted(names)


def main():
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        found = sorted(glob.glob(os.path.join(LISTS, DEFAULT)))
        if not found:
            sys.exit(f"no {DEFAULT} in {LISTS}: run `apt-get update` or name a Packages file")
        path = found[0]
    packages = {}
    for fields in stanzas(read_index(path)):
        if fields.get("Section") in SECTIONS:
            # One line per package name (an index lists each name once; keep the first).
            packages.setdefault(fields["Package"], fields)
    with open(OUT, "w", encoding="utf-8") as out:
        for i, name in enumerate(sorted(packages), start=1):
            fields = packages[name]
            row = {
                "id": i,
                "package": name,
                "section": fields["Section"],
                "description": fields.get("Description", ""),
                "depends": dependencies(fields),
            }
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{OUT}: {len(packages)} packages from {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
