"""The README's quick start runs as written, twice in a row, against a real node."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import Broker

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "the quick start has a python block"
    return block.group(1)


def test_quick_start_runs_twice_in_a_row(broker: Broker) -> None:
    code = quick_start()
    assert "http://127.0.0.1:7942" in code  # the default address, swapped for the test node
    code = code.replace("http://127.0.0.1:7942", broker.url)
    for run in (1, 2):
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
        assert got.returncode == 0, f"run {run}: {got.stderr}"
