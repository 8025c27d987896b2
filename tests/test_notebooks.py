"""Executes every notebooks/*.ipynb top to bottom with the interpreter running the tests.

The kernel is a throw-away kernelspec pointing at sys.executable (the venv's python), so the
test does not depend on which kernels a machine has registered.
"""

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
KERNEL = "rl4mle-test-python"


def _kernel_manager(tmp_path: Path) -> KernelManager:
    spec_dir = tmp_path / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rl4mle test python", "language": "python"}))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=ksm)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, km=_kernel_manager(tmp_path), timeout=600,
        resources={"metadata": {"path": str(tmp_path)}})
    # cwd is tmp_path so that the notebook's outputs (plots) do not land in the repository;
    # notebooks find the repository root through the import of rl4mle_jax or a search upwards.
    client.execute(cwd=str(tmp_path))
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "no output at all"


def test_there_is_a_notebook():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb"
