"""Examples run offline; the fictitious-GAN example is the seed README's snippet verbatim."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_fictitious_gan_snippet_is_verbatim():
    seeds = sorted((ROOT.parent / "shared" / "seeds").glob("004_*.txt"))
    if not seeds:
        pytest.skip("the seed documents are not checked out next to the repo")
    text = seeds[0].read_text(encoding="utf-8", errors="replace")
    snippet = re.search(r"(class FictitiousGANConfig.*?return \[\(latest_g, d\) for d in ds\] \+ \[\(latest_d, g\) for g in gs\])",
                        text, re.S).group(1)
    assert snippet in (ROOT / "examples" / "fictitious_gan.py").read_text()


def test_fictitious_gan_example_runs():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "fictitious_gan.py")], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "generator-3" in out.stdout and "discriminator-3" in out.stdout
