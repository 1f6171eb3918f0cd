"""Every notebook in notebooks/ runs top to bottom (nbclient, kernel ``python3``) with the network blocked.

The network guard is a first cell injected before the notebook's own (not saved): ``socket.connect`` to any
non-loopback address raises, so a notebook that downloads anything fails here. Loopback stays open because the
kernel itself talks to this process over local sockets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
# each notebook should finish in < 60 s on 2 cores; one cell gets this much before the run fails
CELL_TIMEOUT_S = 180

NO_NETWORK = '''
import ipaddress as _ip, socket as _socket

_connect = _socket.socket.connect

def _guarded_connect(self, address, *args):
    host = address[0] if isinstance(address, tuple) else None
    if host is not None:
        try:
            local = _ip.ip_address(host).is_loopback
        except ValueError:
            local = host == "localhost"
        if not local:
            raise OSError(f"network access is blocked in notebook tests (tried {address!r})")
    return _connect(self, address, *args)

_socket.socket.connect = _guarded_connect
'''


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/*.ipynb: expected the project's notebooks"


@pytest.mark.slow
def test_network_guard_blocks_outside_connections_but_not_loopback():
    """The guard can fail a notebook: a cell that opens a socket to a public address errors."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    probe = nbformat.v4.new_notebook()
    probe.cells = [
        nbformat.v4.new_code_cell(NO_NETWORK),
        nbformat.v4.new_code_cell("import socket\nsocket.create_connection(('93.184.215.14', 80), timeout=2)"),
    ]
    with pytest.raises(CellExecutionError, match="network access is blocked"):
        NotebookClient(probe, kernel_name="python3", timeout=CELL_TIMEOUT_S).execute()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_offline(path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    assert notebook.cells, f"{path.name} has no cells"
    notebook.cells.insert(0, nbformat.v4.new_code_cell(NO_NETWORK))
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on the first failing cell
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors
