"""The package reads as its pipeline: every module imports only from its own stage or the
stages before it, and nothing imports the command-line wrappers."""

import ast
from pathlib import Path

import dspark_compile

PACKAGE = Path(dspark_compile.__file__).parent
# each stage may import the ones above it in this list, never one below
STAGES = [{"errors", "rng", "progress"}, {"config"}, {"kernels"}, {"model"}, {"checkpoint"},
          {"draft"}, {"compile"}, {"runtime"}, {"speculative"}, {"tools"},
          {"cli"}, {"__main__"}]


def stage(part: str) -> int:
    return next(i for i, names in enumerate(STAGES) if part in names)


def imports(path: Path) -> set[str]:
    """The first part below ``dspark_compile`` of every module ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [f"{node.module}.{a.name}" for a in node.names]
                 if isinstance(node, ast.ImportFrom) and node.module else [])
        found |= {name.split(".")[1] for name in names if name.startswith("dspark_compile.")}
    return found


def modules() -> list[tuple[str, Path]]:
    """(its first part below the package, path) of every module but the package's own
    ``__init__``, the public API that gathers the stages."""
    paths = sorted(set(PACKAGE.rglob("*.py")) - {PACKAGE / "__init__.py"})
    return [(p.relative_to(PACKAGE).parts[0].removesuffix(".py"), p) for p in paths]


def test_every_module_has_a_stage():
    assert {part for part, _ in modules()} == set().union(*STAGES)


def test_no_module_imports_a_later_stage():
    upward = [f"{path.relative_to(PACKAGE)} imports {name}"
              for part, path in modules() for name in imports(path)
              if stage(name) > stage(part) or (stage(name) == stage(part) and name != part)]
    assert upward == []


def test_nothing_but_the_entry_script_imports_the_cli():
    importers = [str(path.relative_to(PACKAGE)) for part, path in modules()
                 if "cli" in imports(path) and part != "cli"]
    assert importers == ["__main__.py"]


def test_importing_the_package_changes_no_process_wide_setting():
    import subprocess
    import sys

    script = ("import torch; torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"
              " = True; import dspark_compile; print(torch.backends.cuda.matmul."
              "allow_bf16_reduced_precision_reduction)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "True", result.stderr


def test_every_test_module_has_a_basename_of_its_own():
    # the test folders are no packages: pytest imports each module by its basename, and a
    # second module of that name fails the whole run's collection
    tests = Path(__file__).parent
    names = [path.name for path in tests.rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []
