"""Fill the measured tables of README.md and docs/ from the tracked bench outputs.

    python -m bench.doc_tables            # rewrite every table block in place
    python -m bench.doc_tables --check    # list the blocks that differ from their output; exit 1 if any

A table block in a page is

    <!-- table: bench/out_generate/generate_int8.md -->
    ...                                   (written by this script: do not edit by hand)
    <!-- end table -->

The path names a bench output (``bench/out_*/*.md``, tracked by git), relative to the repository
root.  ``#N`` after it (``models.md#3``) picks its Nth markdown table (default: the first).
The block gets a line naming the source (a link relative to the page), the CPU, the date and the
commit, as far as the output (its ``.md`` or the ``.json`` next to it) records them, and
"not recorded in the output" where it does not; then the table, copied verbatim.
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- table: (?P<src>[^ #>]+)(?:#(?P<index>\d+))? -->\n)(?P<body>.*?)(<!-- end table -->)",
                   re.S)
NOT_RECORDED = "not recorded in the output"


def pages(root=ROOT):
    """README.md and every markdown page under docs/."""
    found = [root / "README.md"] if (root / "README.md").exists() else []
    return found + sorted((root / "docs").rglob("*.md"))


def tables(text):
    """The markdown tables of ``text``, each as its lines (header, rule, rows) joined."""
    out, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line.rstrip())
        elif current:
            out.append("\n".join(current))
            current = []
    if current:
        out.append("\n".join(current))
    return [t for t in out if len(t.splitlines()) >= 2 and set(t.splitlines()[1].replace("|", "").strip()) <= set("-: ")]


def _machine(source, text):
    """(cpu, date, commit) as the output records them, else ``NOT_RECORDED``."""
    meta = {}
    companion = source.with_suffix(".json")
    if companion.exists():
        try:
            meta = json.loads(companion.read_text())
        except ValueError:
            meta = {}
    machine = meta.get("machine") if isinstance(meta, dict) else None
    cpu = date = commit = None
    if isinstance(machine, dict):
        if machine.get("cpu"):
            cpu = str(machine["cpu"])
            if machine.get("cores"):
                cpu += f", {machine['cores']} cores"
            if machine.get("features"):
                cpu += f" ({', '.join(machine['features'])})"
        target = machine.get("target") or ""
        mcpu = re.search(r'"mcpu":"([^"]+)"', target)
        if cpu and mcpu:
            cpu += f", TVM target mcpu {mcpu.group(1)}"
        date, commit = machine.get("date"), machine.get("revision") or machine.get("commit")
    if isinstance(meta, dict):
        date = date or meta.get("date")
        commit = commit or meta.get("revision") or meta.get("commit")
    if cpu is None:
        named = re.search(r"^((?:AMD|Intel)[^;.\n]*?, \d+ cores)", text, re.M)
        mcpu = re.search(r'"mcpu":"([^"]+)"', text)
        if named:
            cpu = named.group(1)
        elif mcpu:
            cpu = f"CPU model {NOT_RECORDED}; TVM target mcpu {mcpu.group(1)}"
        elif isinstance(machine, str) and machine:
            cpu = f"{machine}, CPU model {NOT_RECORDED}"
    return cpu or NOT_RECORDED, date or NOT_RECORDED, commit or NOT_RECORDED


def block(page, src, index=1, root=ROOT):
    """The generated body of a block in ``page`` for table ``index`` of ``src``."""
    source = root / src
    if not source.is_file():
        raise ValueError(f"{page.relative_to(root)}: table source {src} does not exist")
    text = source.read_text()
    found = tables(text)
    if not 1 <= index <= len(found):
        raise ValueError(f"{page.relative_to(root)}: {src} has {len(found)} tables, not a table {index}")
    cpu, date, commit = _machine(source, text)
    link = os.path.relpath(source, page.parent).replace(os.sep, "/")
    which = f" (table {index})" if index != 1 else ""
    caption = (f"Source: [`{src}`]({link}){which}. CPU: {cpu}. Date: {date}. "
               f"Commit: {commit}.")
    return f"{caption}\n\n{found[index - 1]}\n\n"


def render(page, text, root=ROOT):
    """``text`` of ``page`` with every table block filled from its source."""
    def fill(m):
        body = block(page, m.group("src"), int(m.group("index") or 1), root)
        return f"{m.group(1)}{body}{m.group(5)}"
    return BLOCK.sub(fill, text)


def stale(root=ROOT):
    """``[(page, source)]`` of every block whose text differs from what its source gives."""
    out = []
    for page in pages(root):
        text = page.read_text()
        for m in BLOCK.finditer(text):
            want = block(page, m.group("src"), int(m.group("index") or 1), root)
            if m.group("body") != want:
                out.append((str(page.relative_to(root)), m.group("src")))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only list stale blocks; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for page, src in bad:
            print(f"{page}: the table from {src} differs from its output (run python -m bench.doc_tables)")
        return 1 if bad else 0
    for page in pages():
        text = page.read_text()
        new = render(page, text)
        if new != text:
            page.write_text(new)
            print(f"updated {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
