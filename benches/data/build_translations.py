#!/usr/bin/env python3
"""Real multilingual text: Debian's translated package descriptions (the `Translation-xx`
indexes of bookworm main, as apt fetches them with `Acquire::Languages`), one Parquet file per
language, for the Unicode tokenizer's real-data test (tests/tokenizer_real_data.rs).

    build_translations.py LISTS_DIR OUT_DIR [PER_LANGUAGE]

LISTS_DIR holds apt's `*_i18n_Translation-xx.lz4` files (benches/data/build.sh fills one with
`apt-get update -o Dir::State::Lists=... -o Acquire::Languages=...`). Writes
OUT_DIR/<xx>.parquet (doc_id uint32, package, text: the short description, a newline, the long
one with its paragraph marks ` .` as blank lines), PER_LANGUAGE descriptions at most (default
3,000), the ones of smallest Description-md5 (a spread over the alphabet that does not move when
packages are added elsewhere), each description once.
"""
import glob
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

LANGUAGES = ["de", "fr", "es", "ru", "ja", "zh_CN"]


def records(path):
    """(package, md5, text) of every entry of a Translation file."""
    raw = subprocess.run(["lz4cat", path], check=True, capture_output=True).stdout
    package = md5 = None
    lines = []
    for line in raw.decode("utf-8", errors="replace").split("\n") + [""]:
        if line == "":
            if package and md5 and lines:
                yield package, md5, "\n".join(lines).strip()
            package = md5 = None
            lines = []
        elif line.startswith("Package: "):
            package = line[len("Package: "):].strip()
        elif line.startswith("Description-md5: "):
            md5 = line[len("Description-md5: "):].strip()
        elif line.startswith("Description-"):
            lines.append(line.split(": ", 1)[1] if ": " in line else "")
        elif line.startswith(" ") and lines:
            body = line[1:]
            lines.append("" if body == "." else body)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    lists, out = sys.argv[1], sys.argv[2]
    per_language = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    os.makedirs(out, exist_ok=True)
    for lang in LANGUAGES:
        # apt escapes '_' in file names as %5f.
        found = glob.glob(os.path.join(lists, f"*_i18n_Translation-{lang.replace('_', '%5f')}.lz4"))
        if not found:
            sys.exit(f"no Translation-{lang} in {lists} (run apt-get update with Acquire::Languages)")
        seen = {}
        for package, md5, text in records(found[0]):
            seen.setdefault(md5, (package, text))
        chosen = sorted(seen.items())[:per_language]
        table = pa.table(
            {
                "doc_id": pa.array(range(len(chosen)), pa.uint32()),
                "package": [p for _, (p, _) in chosen],
                "text": [t for _, (_, t) in chosen],
            }
        )
        path = os.path.join(out, f"{lang}.parquet")
        pq.write_table(table, path, compression="zstd")
        chars = sum(len(t) for _, (_, t) in chosen)
        print(f"{path}: {len(chosen)} descriptions of {len(seen)}, {chars} characters")


if __name__ == "__main__":
    main()
