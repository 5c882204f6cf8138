"""Python runs in the repository's root: `python -c` and `python script.py` put the root first on
sys.path, so no top-level folder may be an importable package named like a standard-library module
(the operator's code lives one level down, in operator/kembed_operator/, for that reason)."""

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USES_OPERATOR = "import operator; operator.eq; print(operator.__file__)"


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory) -> Path:
    """A bare venv (no pip, nothing installed): unlike the project's .venv, whose .pth files load the
    standard library's `operator` before any code runs, nothing here imports it at start."""
    venv = tmp_path_factory.mktemp("fresh-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"


def run_in_root(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_python_c_in_the_root_imports_the_standard_librarys_operator(fresh_python):
    done = run_in_root(str(fresh_python), "-c", USES_OPERATOR)
    assert done.returncode == 0, done.stderr
    assert not done.stdout.strip().startswith(str(ROOT)), done.stdout


def test_a_script_saved_in_the_root_imports_the_standard_librarys_operator(fresh_python):
    script = ROOT / f"root_probe_{uuid.uuid4().hex}.py"
    script.write_text(USES_OPERATOR + "\n")
    try:
        done = run_in_root(str(fresh_python), script.name)
    finally:
        script.unlink()
    assert done.returncode == 0, done.stderr
    assert not done.stdout.strip().startswith(str(ROOT)), done.stdout


def test_the_project_venv_imports_numpy_and_openai_in_the_root_without_dash_p():
    done = run_in_root(sys.executable, "-c", "import numpy, openai; print(numpy.__version__)")
    assert done.returncode == 0, done.stderr


def test_no_top_level_folder_is_a_package_named_like_a_standard_library_module():
    packages = {path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file()}
    modules = {path.stem for path in ROOT.glob("*.py")}
    shadowing = sorted((packages | modules) & sys.stdlib_module_names)
    assert not shadowing
