"""The README's commands are the ones CI and newcomers run."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
                if ln.strip() and not ln.startswith("#") and not ln.startswith("set ") and not ln.startswith("cd ")]
    assert len(ci_lines) == 1, ci_lines
    assert ci_lines[0] in readme
    assert "pytest" in ci_lines[0]


def test_readme_has_the_demo_command():
    readme = (ROOT / "README.md").read_text()
    assert "dgemm demo" in readme and 'pip install -q ".[pocl]"' in readme
