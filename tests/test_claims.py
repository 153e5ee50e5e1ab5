"""The claim list and the user documents: verdicts validated and gathered per claim; docs/CLAIMS.md,
docs/SOURCES.md and the package agree on every claim's articles and notebook; README.md documents the API the
package exports and carries no measurements or paths users do not have."""
import inspect
import json
import re
from pathlib import Path

import pytest

import specdec_lite as sd
from specdec_lite.repro import claims

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ARTICLES = ("000", "002", "003", "004")


def _ids(text: str) -> list[str]:
    return re.findall(r"\bC\d+\b", text)


def _table_rows(text: str) -> dict:
    """{claim id: [cells]} for markdown table rows that start with a claim id."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\| (C\d+) \|", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in line.strip().strip("|").split(" | ")]
    return rows


def test_claim_rows_are_validated_and_gathered_one_verdict_per_claim(tmp_path):
    with pytest.raises(ValueError, match="verdict must be one of"):
        claims.ClaimRow("C1", "000", "x", "y", "probably", "z")
    claims.write_claims([claims.ClaimRow("C1", "000", "exact", "1e-17", "reproduces", "enumeration"),
                         claims.ClaimRow("C5", "000", "table", "15/16", "differs", "one slip")], "a", tmp_path)
    claims.write_claims([claims.ClaimRow("C1", "real", "exact", "p = 0.4", "reproduces", "chi-square"),
                         claims.ClaimRow("C5", "000", "table", "sim ok", "reproduces", "simulation")], "b", tmp_path)
    table = claims.gather(tmp_path)
    assert list(table.claim) == claims.ALL_CLAIMS
    verdicts = dict(zip(table.claim, table.verdict))
    assert verdicts["C1"] == "reproduces" and verdicts["C5"] == "differs"  # one differing check decides
    assert verdicts["C21"] == "not testable here" and verdicts["C2"] == "not testable here"
    row = table.set_index("claim").loc["C5"]
    assert row.measured == "15/16 | sim ok" and row.source == "000"


def test_a_claim_sheet_keeps_one_row_per_check_and_the_last_one_wins(tmp_path):
    def row(cid, source="000", measured="m"):
        return claims.ClaimRow(cid, source, "e", measured, "reproduces", "r")

    sheet = claims.claim_sheet("01_unbiasedness", tmp_path, {"dtype": "float32"})
    sheet.add(row("C1"), row("C2"), row("C3"), row("C4"))
    with pytest.raises(ValueError, match="claims C16, C17, C22 have no row in this kernel yet"):
        sheet.write()  # a partial table never replaces a whole one
    sheet.add(row("C16"), row("C17"), row("C22"), row("C1", "000 (real pair)"))
    sheet.add(row("C4", measured="again"))  # a cell run again: its row is replaced where it stands
    assert claims.claim_sheet("01_unbiasedness", tmp_path, {"dtype": "float32"}) is sheet  # set-up cell run again
    assert claims.claim_sheet("01_unbiasedness", tmp_path, {"dtype": "bfloat16"}) is not sheet
    table = sheet.write()
    assert list(table.claim) == ["C1", "C2", "C3", "C4", "C16", "C17", "C22", "C1"]
    assert table.measured[3] == "again" and set(table.dtype) == {"float32"}
    assert (tmp_path / "claims_01_unbiasedness.csv").read_text() == table.to_csv(index=False)


def test_the_package_knows_every_claim_and_where_it_is_checked():
    assert claims.ALL_CLAIMS == [f"C{i}" for i in range(1, 23)]
    for cid, claim in claims.CLAIMS.items():
        assert claim.id == cid and claim.statement
        assert set(claim.articles.split(", ")) <= set(ARTICLES), cid
        assert (ROOT / "notebooks" / f"{claim.notebook}.ipynb").exists(), (cid, claim.notebook)


def test_claims_document_lists_every_claim_with_its_articles_and_notebook():
    text = (ROOT / "docs" / "CLAIMS.md").read_text()
    rows = _table_rows(text)
    assert list(rows) == claims.ALL_CLAIMS
    for cid, cells in rows.items():
        claim = claims.CLAIMS[cid]
        assert cells[1] == claim.articles, cid
        assert len(cells[2]) > 40, f"{cid}: the claim needs a statement"
        assert claim.notebook in cells[3], f"{cid}: docs/CLAIMS.md must name {claim.notebook}"


def test_sources_document_gives_each_article_its_claims():
    text = (ROOT / "docs" / "SOURCES.md").read_text()
    for article in ARTICLES:
        section = text.split(f"## Article {article}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Title", "**What it is:**", "**What it shows:**", "**Listings:**"):
            assert part in section, (article, part)
        listed = _ids(section.split("**Claims taken from it:**", 1)[1])
        expected = [cid for cid, c in claims.CLAIMS.items() if article in c.articles.split(", ")]
        assert listed == expected, article
    assert "Leviathan" in text and "Chen" in text and "2211.17192" in text and "2302.01318" in text


USER_FILES = ["README.md", "docs/SPEED.md", "docs/CLAIMS.md", "docs/SOURCES.md", "docs/RESULTS.md", "specdec_lite/__init__.py",
              "specdec_lite/repro/claims.py", "specdec_lite/repro/report.py", "specdec_lite/repro/articles.py",
              "specdec_lite/repro/toy.py", "notebooks/04_claims.ipynb"]


@pytest.mark.parametrize("name", USER_FILES)
def test_no_reference_to_material_users_do_not_have(name):
    text = (ROOT / name).read_text()
    assert "../shared" not in text and "/work/shared" not in text and "seeds/" not in text


def test_readme_is_a_user_document():
    lines = README.splitlines()
    assert 120 <= len(lines) <= 200, f"README.md has {len(lines)} lines, at most 200"
    assert "claims:start" not in README and "claims:end" not in README
    for word in ("issue", "session", "(?<!batch-)invariant", "earlier run", "review"):
        assert not re.search(rf"\b{word}", README, re.I), word
    for link in ("docs/RESULTS.md", "docs/CLAIMS.md", "docs/SOURCES.md"):
        assert f"]({link})" in README, link
    for notebook in ("00_train_draft", "00_train_heads", "01_unbiasedness", "02_speedup_table",
                     "03_task_acceptance", "04_claims"):
        assert f"`{notebook}`" in README, notebook
    assert "make reproduce" in README and "make test" in README
    assert re.search(r"`make reproduce` takes about \d+ minutes", README) and re.search(r"`make test` takes about \d+", README)
    # measurements live in docs/RESULTS.md: no table of speedups or verdicts here
    assert "**reproduces**" not in README and not re.search(r"\| \d\.\d\d \|", README)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def test_readme_tables_and_the_speed_document_stay_short():
    """README.md: no table cell over 200 characters (long stories go to docs/SPEED.md); docs/SPEED.md at most 250
    lines (the story and the measured facts that matter, not a diary)."""
    assert _cells("| `a` | b \\| c | d |") == ["`a`", "b \\| c", "d"]
    long = [(i, len(c), c[:60]) for i, line in enumerate(README.splitlines(), 1) if line.startswith("|")
            for c in _cells(line) if len(c) > 200]
    assert not long, long
    speed = (ROOT / "docs" / "SPEED.md").read_text().splitlines()
    assert len(speed) <= 250, f"docs/SPEED.md has {len(speed)} lines, at most 250"


def test_readme_documents_every_exported_name_with_its_real_parameters():
    for name in sd.__all__:
        assert f"`{name}" in README or f"{name}(" in README or f", `{name}`" in README, name
    for fn in (sd.load_model, sd.load_pair, sd.load_draft, sd.speculative_generate, sd.autoregressive_generate,
               sd.verify, sd.verify_greedy, sd.SamplingParams, sd.NGramDraft, sd.LayerSkipDraft,
               sd.theory.speedup, sd.theory.best_gamma):
        documented = re.search(rf"`{fn.__name__}\((.*?)\)`", README)
        assert documented, fn.__name__
        params = inspect.signature(fn).parameters
        for arg in documented.group(1).split(", "):
            name, _, default = arg.partition("=")
            if name in ("*", "...") or not name:
                continue
            assert name in params, (fn.__name__, name)
            actual = params[name].default
            if default and default != "..." and "(" not in default:
                value = getattr(sd, default) if hasattr(sd, default) else default.strip('"')
                assert str(value) == str(actual), (fn.__name__, name, default, actual)
