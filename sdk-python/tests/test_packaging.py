"""The package as a user gets it: wheel and sdist build, install into a fresh venv, import."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

import narad

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import importlib.metadata as md, narad
meta = md.metadata("narad")
assert narad.__version__ == md.version("narad"), (narad.__version__, md.version("narad"))
urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
assert {"Homepage", "Repository", "Issues"} <= set(urls), urls
classifiers = meta.get_all("Classifier")
assert any(c.startswith("Programming Language :: Python :: 3.1") for c in classifiers)
eps = [e for e in md.entry_points(group="pytest11") if e.name == "narad"]
assert eps and eps[0].value == "narad.pytest_plugin", eps  # loads under pytest only
import narad.testing
assert narad.NotImplemented and narad.Internal and narad.Client
print(narad.__version__)
"""


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", str(out),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next(out.glob("narad-*.whl"))
    sdist = next(out.glob("narad-*.tar.gz"))
    return {"wheel": wheel, "sdist": sdist}


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_dist_installs_into_a_fresh_venv_and_imports(kind: str, dists: dict[str, Path],
                                                     tmp_path: Path) -> None:
    assert dists[kind].name.startswith(f"narad-{narad.__version__}")
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = env / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    str(dists[kind])], check=True, timeout=600)
    got = subprocess.run([str(py), "-c", CHECK], check=True, capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert got.stdout.strip() == narad.__version__
