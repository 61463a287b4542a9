"""The README's Python snippet works as a script without its `__main__` guard
(rpeg.runtime.main_guard keeps spawned Dask workers from re-running an unguarded script); as
written, with the guard, tests/firstday/test_readme_tour.py runs it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rpeg.runtime.main_guard import line_is_guarded

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """\
import os
x = 1
if __name__ == "__main__":
    run()
def f():
    run()
if "__main__" == __name__:
    run()
run()
"""


def test_guard_detection_reads_the_script():
    assert not line_is_guarded(SCRIPT, 2)
    assert line_is_guarded(SCRIPT, 4)  # inside the guard
    assert line_is_guarded(SCRIPT, 6)  # inside a function: not run by the import
    assert line_is_guarded(SCRIPT, 8)  # the guard written the other way round
    assert not line_is_guarded(SCRIPT, 9)


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    part = text.split("From Python:", 1)[1]
    return re.search(r"```python\n(.*?)```", part, re.S).group(1)


def _run(script: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, RPEG_CACHE=os.environ.get("RPEG_CACHE", ""))
    env.pop("RPEG_CACHE") if not env["RPEG_CACHE"] else None
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_readme_snippet_runs_as_a_script_without_its_guard(tmp_path):
    code = readme_snippet()
    assert 'if __name__ == "__main__":' in code
    out = str(tmp_path / "out")
    code = code.replace(
        '{"runtime.steps": 5}', f'{{"runtime.steps": 2, "runtime.output_dir": {out!r}}}'
    )
    # as users first write it: everything at the top level
    code = code.replace('if __name__ == "__main__":\n', "").replace("\n    ", "\n")
    assert "\nsummary = train(" in code
    code += "print('SUMMARY', summary['steps'])\n"
    script = tmp_path / "snippet.py"
    script.write_text(code)
    res = _run(script, tmp_path)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert "SUMMARY 2" in res.stdout, log[-3000:]
    assert "Nanny failed to start" not in log
    assert "worker processes will not re-run the script" in log
    assert (tmp_path / "out" / "metrics.jsonl").exists()
