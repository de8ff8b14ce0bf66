"""The README's commands are the ones CI and newcomers run."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ci_lines() -> list[str]:
    return [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
            if ln.strip() and not ln.startswith("#") and not ln.startswith("set ") and not ln.startswith("cd ")]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    lines = ci_lines()
    # system packages first (apt-get) and CI's own checks (.ci/ scripts), then exactly one command: the README's
    setup, rest = [], list(lines)
    while rest and rest[0].startswith(("apt-get ", "bash .ci/")):
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


# -- the cluster guide: the commands tests/test_slurm.py runs on a real one-node SLURM ---------------
def cluster_guide() -> list[str]:
    """The commands of the README's "Clusters" section (its first bash block), one per line, comments dropped."""
    readme = (ROOT / "README.md").read_text()
    assert "\n## Clusters\n" in readme, "the README has no '## Clusters' section"
    section = readme.split("\n## Clusters\n", 1)[1].split("\n## ", 1)[0]
    assert "```bash\n" in section, "the Clusters section has no bash block"
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [ln.split("  #", 1)[0].strip() for ln in block.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def parse_dgemm(words: list[str]):
    """Parse a ``dgemm ...`` command line down to its command, as running it would, without running it."""
    import click

    from dgemm.cli import cli

    assert words[0] == "dgemm", words
    command, args = cli, words[1:]
    while isinstance(command, click.Group):
        name, args = args[0], args[1:]
        assert name in command.commands, f"dgemm has no command {name!r}: {words}"
        command = command.commands[name]
    return command.make_context(command.name, list(args)).params


def test_cluster_guide_commands_are_dgemm_commands():
    """Every line of the guide is a dgemm command its parser accepts: it makes the inputs, shows a job script
    and multiplies on SLURM jobs (tests/test_slurm.py runs the same lines)."""
    import shlex

    guide = cluster_guide()
    parsed = [(shlex.split(ln), parse_dgemm(shlex.split(ln))) for ln in guide]
    kinds = [tuple(words[1:3]) for words, _ in parsed]
    assert ("random", "a.zarr") in kinds and ("random", "b.zarr") in kinds
    jobs = [(words, params) for words, params in parsed if words[1:3] == ["jobqueue", "slurm"]]
    assert [params["dry_run"] for _, params in jobs] == [True, False], guide
    multiply = jobs[1][1]
    assert (multiply["a"], multiply["b"], multiply["out"]) == ("a.zarr", "b.zarr", "c.zarr")


def test_ci_installs_slurm_for_the_cluster_test():
    setup = [ln for ln in ci_lines() if ln.startswith("apt-get ")]
    words = {w for ln in setup if "install" in ln for w in ln.split()}
    assert {"slurm-wlm", "munge"} <= words, setup


# -- "How it works": the README's tree is the tree ----------------------------------------------------
def readme_tree() -> str:
    readme = (ROOT / "README.md").read_text()
    assert "\n```\ndgemm/\n" in readme, "the README has no dgemm/ tree"
    return readme.split("\n```\ndgemm/\n", 1)[1].split("\n```", 1)[0]


def test_the_readme_tree_names_every_module_and_no_other():
    import re

    tree = readme_tree()
    named = set(re.findall(r"\b([a-z_0-9]+\.py)\b", tree))
    package = ROOT / "dgemm"
    modules = {p.name for p in package.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    folders = {p.parent.relative_to(package).as_posix() for p in package.rglob("__init__.py")} - {"."}
    assert not modules - named, f"modules the README's tree does not name: {sorted(modules - named)}"
    assert not named - modules - {"__init__.py"}, f"the README's tree names no such module: {sorted(named - modules)}"
    missing = {f for f in folders if not re.search(rf"^  {re.escape(f)}/ ", tree, re.M)}
    assert not missing, f"packages the README's tree does not list: {sorted(missing)}"
