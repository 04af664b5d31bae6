"""``Docket.add`` is typed with ParamSpec: mypy checks the call's arguments."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

GOOD = """
from docket_core import Docket

async def greet(name: str, times: int = 1) -> str:
    return name * times

def shout(text: str) -> str:
    return text.upper()

async def main(docket: Docket) -> None:
    await docket.add(greet)("world")
    await docket.add(greet, key="k")("world", times=2)
    await docket.add(shout)("hi")
    await docket.add("greet")(1, 2, 3)
"""

BAD = """
from docket_core import Docket

async def greet(name: str) -> str:
    return name

async def main(docket: Docket) -> None:
    await docket.add(greet)(42)
"""


def run_mypy(source: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "snippet.py"
    path.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_add_accepts_the_task_signature(tmp_path: Path) -> None:
    result = run_mypy(GOOD, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_add_rejects_wrong_arguments(tmp_path: Path) -> None:
    result = run_mypy(BAD, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'incompatible type "int"; expected "str"' in result.stdout
