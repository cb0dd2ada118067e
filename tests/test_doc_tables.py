"""README.md and docs/ against the repository: every measured table equals the bench output it
names (``bench/doc_tables.py`` writes them), every relative link resolves to a file in the
repository, every test cited as ``tests/FILE.py::NAME`` exists, and every decimal number on a
README line that links a bench output appears in that output.  Fast: text only, no TVM."""
import re
import shutil
from pathlib import Path

import pytest

from bench import doc_tables

ROOT = doc_tables.ROOT
PAGES = doc_tables.pages()
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def _links(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)       # (code blocks hold no links)
    return [m.group(1) for m in LINK.finditer(text)]


def test_pages_exist():
    assert (ROOT / "README.md") in PAGES and len(PAGES) > 10, PAGES


def test_every_table_equals_its_output():
    assert doc_tables.stale() == [], "run: python -m bench.doc_tables"


def test_every_table_names_its_source_cpu_date_and_commit():
    blocks = [(p, m) for p in PAGES for m in doc_tables.BLOCK.finditer(p.read_text())]
    assert len(blocks) >= 10, "the measured tables are generated, not copied"
    for page, m in blocks:
        assert not m.group("src").startswith("bench/out/"), (page, "bench/out/ is not tracked (.gitignore)")
        caption = m.group("body").splitlines()[0]
        for field in ("Source: ", "CPU: ", "Date: ", "Commit: "):
            assert field in caption, (page, caption)


def test_a_changed_copy_is_caught(tmp_path):
    """The check can fail: one cell changed in a copy of a page is reported, and rendering
    the page again puts the output's value back."""
    page = next(p for p in PAGES if doc_tables.BLOCK.search(p.read_text()))
    src = doc_tables.BLOCK.search(page.read_text()).group("src")
    (tmp_path / src).parent.mkdir(parents=True)
    shutil.copy(ROOT / src, tmp_path / src)
    for sibling in (ROOT / src).parent.glob((ROOT / src).stem + ".json"):
        shutil.copy(sibling, tmp_path / src.rsplit("/", 1)[0] / sibling.name)
    copy = tmp_path / page.relative_to(ROOT)
    copy.parent.mkdir(parents=True, exist_ok=True)
    text = doc_tables.render(copy, f"<!-- table: {src} -->\n<!-- end table -->\n", tmp_path)
    copy.write_text(text)
    assert doc_tables.stale(tmp_path) == []
    row = next(line for line in text.splitlines() if line.startswith("|") and re.search(r"\d", line))
    changed = re.sub(r"\d", lambda d: str((int(d.group()) + 1) % 10), row, count=1)
    copy.write_text(text.replace(row, changed))
    assert doc_tables.stale(tmp_path) == [(str(copy.relative_to(tmp_path)), src)]
    assert doc_tables.render(copy, copy.read_text(), tmp_path) == text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page):
    for target in _links(page):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), (page, target, "outside the repository")
        assert path.exists(), (page, target)
        assert not str(path.relative_to(ROOT)).startswith("bench/out/"), (page, target, "not tracked")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_tests_exist(page):
    for path, name in CITED.findall(page.read_text()):
        source = ROOT / path
        assert source.is_file(), (page, path)
        assert re.search(rf"^\s*def {name}\(", source.read_text(), re.M), (page, f"{path}::{name}")


def test_readme_numbers_come_from_the_outputs_they_link():
    """A README line that links bench outputs states only numbers those outputs hold."""
    checked = 0
    for line in (ROOT / "README.md").read_text().splitlines():
        sources = [t for t in (m.group(1) for m in LINK.finditer(line)) if t.startswith("bench/out_")]
        if not sources:
            continue
        held = " ".join((ROOT / s).read_text() for s in sources)
        prose = LINK.sub("", line)
        for number in re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", prose):
            assert number in held, (number, line)
            checked += 1
    assert checked >= 6, "the headline numbers cite their outputs"
