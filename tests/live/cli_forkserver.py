"""A fork server for the Backend.AI client's `backend.ai` command, run by the client's own
venv Python (it imports nothing of this project): `python cli_forkserver.py SOCKET`.

The client's CLI spends 1.3-1.5 s of CPU importing itself at every run (its entry points,
pydantic models) and the live tests run it some 240 times, a third of the live tests' CPU
on a 2-core machine. This process imports the CLI once, then forks a child per request; the
child is the CLI's run: the request's argv, environment (os.environ replaced: the client
reads its configuration from the environment when a command first asks for it, never at
import), working directory, stdin from /dev/null, stdout and stderr into the request's
files; it calls the console script's `main` as the script does, and ends with its exit
code after the interpreter's exit functions, as a process that exits does.

Protocol, one request per connection: the client sends one JSON line
{"argv": [...], "env": {...}, "cwd": "...", "stdout": path, "stderr": path} (or
{"python": code, ...} to run code as `python -c` would, or {"script": path, "argv": [...],
...} to run a script as `python path ...` would); the child answers a line with its
pid, then, when the command is over, a line with its exit code.
"""

import atexit
import contextlib
import importlib
import json
import os
import pkgutil
import runpy
import signal
import socket
import sys
import traceback


def preload():
    from ai.backend.cli.__main__ import main

    # The groups the CLI loads lazily at their first use, and the client's modules.
    for package_name in ("ai.backend.client.cli", "ai.backend.client.func"):
        try:
            package = importlib.import_module(package_name)
        except ImportError:
            continue
        for module in pkgutil.walk_packages(package.__path__, package_name + "."):
            # A module that does not load here is one the CLI would not load either.
            with contextlib.suppress(Exception):
                importlib.import_module(module.name)
    return main


def run_child(connection, main):
    request = json.loads(connection.makefile("rb").readline())
    connection.sendall(f"{os.getpid()}\n".encode())
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request.get("cwd") or os.environ.get("HOME", "/"))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    code = 0
    try:
        if "python" in request:
            sys.argv = ["-c", *request.get("argv", [])]
            exec(compile(request["python"], "<string>", "exec"), {"__name__": "__main__"})
        elif "script" in request:
            sys.argv = [request["script"], *request.get("argv", [])]
            sys.path.insert(0, os.path.dirname(os.path.abspath(request["script"])))
            runpy.run_path(request["script"], run_name="__main__")
        else:
            sys.argv = ["backend.ai", *request["argv"]]
            code = main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 (printed and answered as Python would)
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing to flush
                stream.flush()
        try:
            connection.sendall(f"{code}\n".encode())
        finally:
            os._exit(code & 0xFF)


def serve(path):
    main = preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    server.listen(64)
    os.rename(path + ".tmp", path)  # the socket appears once the CLI is loaded
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        connection, _ = server.accept()
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            server.close()
            run_child(connection, main)
        connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
