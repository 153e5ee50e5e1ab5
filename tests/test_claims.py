"""Claim rows: verdicts are validated, gathered per claim, and written into the README's section."""
import pytest

from specdec_lite.repro import claims


def test_claim_rows_gather_and_readme(tmp_path):
    with pytest.raises(ValueError, match="verdict must be one of"):
        claims.ClaimRow("C1", "000", "x", "y", "probably", "z")
    claims.write_claims([claims.ClaimRow("C1", "000", "exact", "1e-17", "reproduces", "enumeration"),
                         claims.ClaimRow("C5", "000", "table", "15/16", "differs", "one slip")], "a", tmp_path)
    claims.write_claims([claims.ClaimRow("C1", "real", "exact", "p = 0.4", "reproduces", "chi-square"),
                         claims.ClaimRow("C5", "000", "table", "sim ok", "reproduces", "simulation")], "b", tmp_path)
    table = claims.gather(tmp_path)
    assert list(table.claim) == claims.ALL_CLAIMS
    verdicts = dict(zip(table.claim, table.verdict))
    assert verdicts["C1"] == "reproduces" and verdicts["C5"] == "differs"
    assert verdicts["C21"] == "not testable here" and verdicts["C2"] == "not testable here"
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{claims.README_START}\nold\n{claims.README_END}\nend\n")
    claims.update_readme(readme, table)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("\nend\n") and "old" not in text
    assert "| C5 | 000 | table | 15/16 / sim ok | **differs** |" in text
