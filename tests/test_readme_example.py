"""The README's Python example, exactly as written, run as a user runs it: as a script with no
`if __name__ == "__main__":` guard, and from standard input, each on the 4 gloo ranks of
cpu4 in a fresh interpreter. Spawned ranks must not run the user's script again
(`runtime/workers.library_main`)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 240  # a hang fails the test instead of the suite


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has no python example"
    code = "\n".join(blocks)  # the training example goes on from the first
    assert "__main__" not in code and 'backend="gloo"' in code  # the case that used to fail
    return code + '\nprint("README example OK")\n'


# the script is how most run it; standard input (no file for spawned ranks to import) is slow
@pytest.mark.parametrize("how", ["script", pytest.param("stdin", marks=pytest.mark.slow)])
def test_readme_example_runs_without_a_main_guard(how, tmp_path):
    code = readme_example()
    if how == "script":
        script = tmp_path / "example.py"
        script.write_text(code, encoding="utf-8")
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=LIMIT_S, cwd=tmp_path)
    else:
        run = subprocess.run([sys.executable, "-"], input=code, capture_output=True,
                             text=True, timeout=LIMIT_S, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "README example OK" in run.stdout
