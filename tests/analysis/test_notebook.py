"""examples/quota-analysis.ipynb runs headless, top to bottom, in a real Jupyter kernel.

The kernel is this interpreter (a kernelspec written to a temporary directory that
points at ``sys.executable``), so it imports the quotaengine under test whatever
other "python3" kernels the machine has. Any failing cell fails the test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "quota-analysis.ipynb"
KERNEL = "quotaengine-test"

pytestmark = [pytest.mark.timeout(180)]


def test_notebook_is_stored_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "the notebook has code cells"
    assert all(c.outputs == [] and c.execution_count is None for c in code)


def test_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    # Jupyter's own paths: no migration warnings, nothing read from or written to ~.
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    spec_dir = tmp_path / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "quotaengine test kernel",
                "language": "python",
            }
        )
    )
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")], ensure_native_kernel=False)
    assert ksm.get_kernel_spec(KERNEL).argv[0] == sys.executable
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=ksm)

    nb = nbformat.read(NOTEBOOK, as_version=4)
    workdir = tmp_path / "work"
    workdir.mkdir()
    client = nbclient.NotebookClient(
        nb,
        km=km,
        timeout=120,
        kernel_name=KERNEL,
        allow_errors=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    try:
        # Raises CellExecutionError on the first failing cell; cleanup_kc: shut the
        # kernel down and close the client's sockets even though we own the manager.
        client.execute(cleanup_kc=True)
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        km.cleanup_resources()

    outputs = {c.id: c.outputs for c in nb.cells if c.cell_type == "code"}
    errors = [o for outs in outputs.values() for o in outs if o.output_type == "error"]
    assert errors == []

    def data(cell_id: str) -> dict[str, str]:
        results = [o for o in outputs[cell_id] if o.output_type == "execute_result"]
        assert len(results) == 1, (cell_id, outputs[cell_id])
        return dict(results[0]["data"])

    # The demo ran with zero overshoot.
    demo_text = "".join(o.get("text", "") for o in outputs["build"] if o.output_type == "stream")
    assert "overshoot: 0 requests over a published limit" in demo_text
    # The snapshot shows as an HTML table of the demo's routes with the benched routes.
    snapshot = data("open")["text/html"]
    assert "quotaengine" in snapshot and "<table" in snapshot and "demo-groq" in snapshot
    assert "authoritative" in snapshot and "heuristic" in snapshot
    # DataFrames render as HTML tables; each plot is an image.
    for cell_id in ("events", "state", "cooldowns"):
        assert "<table" in data(cell_id)["text/html"], cell_id
    for cell_id in ("plot-usage", "plot-utilisation", "plot-cooldowns"):
        assert "image/png" in data(cell_id), cell_id
    assert not list(workdir.iterdir())  # the notebook cleaned up after itself
