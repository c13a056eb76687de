"""Query mode of Python kernels: one interpreter per kernel, whose state lasts from one run to
the next, as Backend.AI's Python kernel runner keeps one (an IPython kernel there).

This file is not imported by the agent: its text runs inside the kernel's container, with
the image's Python (only its standard library, Python 3.6 or later), as the command of
every query-mode run:

    python3 -c SOURCE run CODE

That process is the *client* of the run. It connects to the kernel's interpreter (the
*server*: a process of the container, started by the first query, which forks it off and
leaves it behind in a session of its own) on an abstract unix socket, and hands it CODE and
its own stdout and stderr (SCM_RIGHTS). The server runs CODE with those descriptors as its
own 1 and 2, so everything the code writes, a subprocess's or a C library's output too,
goes straight to the run's output as it is written, stdout and stderr apart; then it puts
its /dev/null back (the run's output ends with nothing of it left open), answers the exit
code, and the client exits with it. A signal that ends the run (the agent's stop, the
run's timeout: SIGHUP or SIGTERM, or SIGINT) becomes a KeyboardInterrupt in the code.

Like the IPython kernel: the value of a final expression is printed (repr, through
sys.displayhook, so `_` holds it); an exception's traceback goes to stderr, SystemExit
included, and sets the exit code (SystemExit's own code, else 1). One run at a time: a
second client waits for the first. If the server ends (os._exit in the code, a crash), the
next run starts a fresh one.
"""

import array
import ast
import builtins
import contextlib
import io
import linecache
import os
import signal
import socket
import struct
import sys
import time
import traceback
import types

NAME = "\0backendai-python-query"  # abstract: one per network namespace, so per container
HEADER = struct.Struct("!i")
START_SECONDS = 10.0
MAX_CODE = 64 * 1024 * 1024
START_MARKER = b"\0backendai:code-started\0\n"  # as session_streams.START_MARKER


def receive_exactly(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the peer closed the connection")
        data += chunk
    return data


# The server.

def serve(listener):
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    # Line-buffered, as a terminal's Python: a line shows as soon as it is printed.
    streams = (text_stream(1), text_stream(2))
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__ = streams
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.argv = [""]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The code's own __main__ (pickle and dataclasses look classes up there).
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    count = 0
    while True:
        try:
            count += 1
            serve_one(listener, devnull, main.__dict__, count, streams)
        except KeyboardInterrupt:  # a stop that came between runs
            continue


def text_stream(fd):
    return io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w", closefd=False)),
                            encoding="utf-8", errors="backslashreplace", line_buffering=True,
                            write_through=True)


def serve_one(listener, devnull, namespace, count, streams):
    conn, _ = listener.accept()
    with conn:
        try:
            conn.sendall(HEADER.pack(os.getpid()))
            code, fds = receive_request(conn)
        except (OSError, EOFError, ValueError):
            return  # a client that went away while it waited for its turn
        sys.stdout, sys.stderr = streams  # whatever the last run left there
        try:
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
        finally:
            for fd in fds:
                os.close(fd)
        exit_code = 1
        try:
            exit_code = run(code, namespace, f"<input-{count}>")
        finally:
            # No interrupt now: the run's output must end, and its client hear the code.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            flush_all(streams)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            flush_all(streams)  # what a closed pipe refused goes to /dev/null, not the next run
            with contextlib.suppress(OSError):
                conn.sendall(HEADER.pack(exit_code))
            signal.signal(signal.SIGINT, signal.default_int_handler)


def flush_all(streams):
    for stream in streams:
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def receive_request(conn):
    fds = array.array("i")
    data, ancillary, _flags, _addr = conn.recvmsg(
        HEADER.size, socket.CMSG_SPACE(2 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request carries the client's stdout and stderr")
    try:
        data += receive_exactly(conn, HEADER.size - len(data))
        (size,) = HEADER.unpack(data)
        if not 0 <= size <= MAX_CODE:
            raise ValueError("bad size")
        code = receive_exactly(conn, size).decode("utf-8", "surrogateescape")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return code, list(fds)


def run(code, namespace, filename):
    """Runs `code` in `namespace`; its exit code."""
    # Tracebacks show the lines of the code.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename)
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL in the code
        report(exc, tb=None)
        return 1
    try:
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Interactive(body=[tree.body.pop()])
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:  # "single": its value goes to sys.displayhook, as at a prompt
            exec(compile(last, filename, "single"), namespace)
        return 0
    except SystemExit as exc:
        report(exc)
        return exit_code_of(exc)
    except BaseException as exc:  # KeyboardInterrupt too: the run ends, the kernel stays
        report(exc)
        return 1


def report(exc, tb=...):
    if tb is ...:  # this module's own frame (run) is left out: it starts in the code
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    try:
        sys.stdout.flush()
        traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def exit_code_of(exc):
    if exc.code is None:
        return 0
    if isinstance(exc.code, int) and not isinstance(exc.code, bool):
        return exc.code
    return 1


# The client.

def client(name, code, marked=True):
    sock = connect(name)
    server = HEADER.unpack(receive_exactly(sock, HEADER.size))[0]

    def interrupt(signum, frame):
        with contextlib.suppress(OSError):
            os.kill(server, signal.SIGINT)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)
    # The agent's mark of the code's start (agents_app/runtime/session_streams.py): its
    # output is gathered from here, not from this process's own start.
    if marked:
        os.write(2, START_MARKER)
    data = code.encode("utf-8", "surrogateescape")
    sock.sendmsg([HEADER.pack(len(data))],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [1, 2]))])
    sock.sendall(data)
    try:
        return HEADER.unpack(receive_exactly(sock, HEADER.size))[0]
    except (OSError, EOFError):
        sys.stderr.write("The kernel's Python interpreter ended during this run; the next "
                         "run starts a new one (its variables are gone).\n")
        return 1


def connect(name):
    deadline = time.monotonic() + START_SECONDS
    started = False
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(name)
            return sock
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            if time.monotonic() > deadline:
                raise
        if not started:
            start_server(name)
            started = True
        time.sleep(0.01)


def start_server(name):
    """The server, forked off this client and left in a session of its own: it outlives
    the run (and the run's timeout, which signals the run's process group)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)
    except OSError:  # another client started one meanwhile
        listener.close()
        return
    listener.listen(16)
    first = os.fork()
    if first:
        listener.close()
        os.waitpid(first, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        serve(listener)
    finally:
        os._exit(1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        sys.exit(client(NAME, sys.argv[2]) & 0xFF)
    if len(sys.argv) == 4 and sys.argv[1] == "run-at":  # another socket name, unmarked (tests)
        sys.exit(client("\0" + sys.argv[2], sys.argv[3], marked=False) & 0xFF)
    sys.stderr.write("usage: python3 -c SOURCE run CODE\n")
    sys.exit(2)
