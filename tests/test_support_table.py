"""The README's table of model families x methods matches the tests it is generated from."""

from pathlib import Path

from support_table import END, README, START
from test_caches_methods import FAMILIES, METHODS


def _table():
    text = Path(README).read_text(encoding="utf-8")
    body = text.split(START)[1].split(END)[0].strip().splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in body]
    return rows[0], rows[2:]


def test_readme_table_has_every_family_and_method_and_no_failure():
    """Regenerate it with ``python tests/support_table.py`` when this fails."""
    header, rows = _table()
    assert header[2:] == [f"`{m}`" for m in METHODS]
    assert [row[0] for row in rows] == [f"`{f}`" for f in FAMILIES]
    cells = [cell for row in rows for cell in row[2:]]
    assert all(cell.startswith("✓") for cell in cells), cells
