"""Query mode's interpreter (agents_app/runtime/python_query.py), run here as the agent runs
it in a kernel's container: `python3 -c SOURCE run CODE`, one process per run, against one
interpreter that the first run starts (on a socket name of this test's own, so that it is
the test's alone) and that keeps its state from run to run."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agents_app.runtime import python_query

SOURCE = Path(python_query.__file__).read_text()


@pytest.fixture
def kernel(tmp_path):
    """run(code) → (exit code, stdout, stderr) of one query-mode run, in tmp_path."""
    name = f"bai-test-{uuid.uuid4().hex}"

    def start(code):
        return subprocess.Popen([sys.executable, "-c", SOURCE, "run-at", name, code],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def run(code, timeout=30):
        process = start(code)
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err

    run.start = start
    yield run
    code, out, _ = run("import os; os.getpid()")
    if code == 0:
        os.kill(int(out), signal.SIGKILL)


def test_state_lasts_from_one_run_to_the_next(kernel):
    assert kernel("x = 1") == (0, "", "")
    assert kernel("print(x)") == (0, "1\n", "")
    assert kernel("x += 41\nx") == (0, "42\n", "")
    assert kernel("import os; os.getpid()")[1] == kernel("import os; os.getpid()")[1]


def test_the_value_of_a_final_expression_is_printed(kernel):
    assert kernel("1 + 1") == (0, "2\n", "")
    assert kernel("'text'") == (0, "'text'\n", "")
    assert kernel("_ * 2") == (0, "'texttext'\n", "")  # `_` holds the last value shown
    assert kernel("None") == (0, "", "")
    assert kernel("y = 3") == (0, "", "")  # a statement shows nothing


def test_an_exception_is_its_traceback_on_stderr_and_exit_code_1(kernel):
    code, out, err = kernel("def f():\n    raise ValueError('bad')\nprint('before')\nf()")
    assert (code, out) == (1, "before\n")
    assert err.startswith("Traceback (most recent call last):\n")
    assert 'File "<input-1>", line 4, in <module>' in err and "in f\n" in err
    assert "raise ValueError('bad')" in err and err.endswith("ValueError: bad\n")
    assert "python_query" not in err and "<string>" not in err  # the code's frames only


def test_system_exit_is_reported_with_its_code(kernel):
    code, out, err = kernel("import sys; sys.exit(2)")
    assert (code, out) == (2, "")
    assert "Traceback" in err and err.endswith("SystemExit: 2\n")
    assert kernel("raise SystemExit")[0] == 0
    assert kernel("raise SystemExit('why')")[0] == 1
    assert kernel("print('still here')") == (0, "still here\n", "")


def test_a_syntax_error_is_reported_without_running_anything(kernel):
    code, out, err = kernel("print('no')\n1 +")
    assert (code, out) == (1, "")
    assert 'File "<input-1>", line 2' in err and "SyntaxError" in err


def test_output_of_subprocesses_reaches_the_run_on_its_own_stream(kernel):
    code, out, err = kernel("import os\nos.system('echo from-shell; echo to-stderr >&2')\n"
                            "print('from-python')")
    assert code == 0
    assert out == "from-shell\nfrom-python\n" and err == "to-stderr\n"


def test_the_code_runs_in_the_runs_working_directory_as_main(kernel, tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    assert kernel("import helper; helper.VALUE") == (0, "7\n", "")
    assert kernel("__name__") == (0, "'__main__'\n", "")
    assert kernel("import pickle\nclass P: pass\nlen(pickle.dumps(P())) > 0") == (
        0, "True\n", "")


def test_a_stopped_run_is_interrupted_and_the_interpreter_stays(kernel):
    assert kernel("count = 1")[0] == 0
    process = kernel.start("import time\nprint('started', flush=True)\ntime.sleep(30)\n"
                           "count = 2")
    assert process.stdout.readline() == "started\n"
    process.send_signal(signal.SIGHUP)  # as the agent's stop reaches it
    out, err = process.communicate(timeout=10)
    assert process.returncode == 1 and err.rstrip().endswith("KeyboardInterrupt"), err
    assert kernel("count") == (0, "1\n", "")


def test_runs_wait_for_one_another(kernel):
    assert kernel("import time")[0] == 0
    started = time.monotonic()
    first = kernel.start("time.sleep(1); print('first')")
    time.sleep(0.3)
    second = kernel("print('second')")
    assert second == (0, "second\n", "")
    assert time.monotonic() - started >= 1.0  # the second waited for the first
    assert first.communicate(timeout=10)[0] == "first\n"


def test_an_interpreter_that_ended_is_started_again(kernel):
    assert kernel("x = 1")[0] == 0
    code, _, err = kernel("import os; os._exit(3)")
    assert code == 1 and "interpreter ended" in err
    code, _, err = kernel("x")
    assert code == 1 and "NameError" in err  # a new interpreter: x is gone
    assert kernel("x = 5; x") == (0, "5\n", "")
