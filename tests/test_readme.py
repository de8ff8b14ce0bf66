"""The README's commands are the ones CI and newcomers run."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ci_lines() -> list[str]:
    return [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
            if ln.strip() and not ln.startswith("#") and not ln.startswith("set ") and not ln.startswith("cd ")]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    lines = ci_lines()
    # system packages first (apt-get only), then exactly one command: the README's, verbatim
    setup, rest = [], list(lines)
    while rest and rest[0].startswith("apt-get "):
        setup.append(rest.pop(0))
    assert len(rest) == 1, lines
    assert rest[0] in readme
    assert "pytest" in rest[0]
    assert all("pytest" not in ln for ln in setup)


def test_ci_installs_chromium_for_the_browser_test():
    setup = [ln for ln in ci_lines() if ln.startswith("apt-get ")]
    assert any("install" in ln and "chromium" in ln.split() for ln in setup), setup


def test_readme_has_the_demo_command():
    readme = (ROOT / "README.md").read_text()
    assert "dgemm demo" in readme and 'pip install -q ".[pocl]"' in readme
