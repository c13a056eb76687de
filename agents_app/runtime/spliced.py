"""HTTP/1.1 chunked bodies moved between a pipe and a socket by splice(2): the bytes go from
one kernel buffer to the other and never through Python, which only writes and reads the
chunks' size lines. A kept volume's tar crosses from the source's `tar -c` to the target's
`tar -x` this way (kept_streams.py, kept_fetch.py): relayed through Python's reads and
writes, the GiB took twice as long as the two tars alone.

The chunked framing is kept for what it tells the receiver: the last, empty chunk is sent
only after the source's tar ended well, so a body cut off anywhere (a tar that failed, an
agent that died) never passes for a whole one. Both sockets may be non-blocking (the
source's belongs to the stream endpoint's event loop, the target's has a timeout): a
splice that would block waits in poll(2), up to `timeout` seconds without progress."""

import fcntl
import os
import select
import socket
import termios

CHUNK = 1024 * 1024  # the most one chunk carries: a pipe's size (kept.bigger_pipe)
SIZE_LINE_MAX = 64  # bytes of a chunk's size line, extensions included
TRAILER_LINE_MAX = 8192
END = b"0\r\n\r\n"


class Broken(OSError):
    """The other side went away, stopped answering, or sent no chunked body."""


def _wait(fd, events, timeout):
    poller = select.poll()
    poller.register(fd, events)
    if not poller.poll(timeout * 1000):
        raise Broken(f"no progress in {timeout} s")


def send_bytes(sock_fd, data, timeout):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(sock_fd, view):]
        except BlockingIOError:
            _wait(sock_fd, select.POLLOUT, timeout)


def _splice(source_fd, target_fd, size, wait_fd, events, timeout):
    """Exactly `size` bytes from source_fd to target_fd (one is a pipe); Broken when the
    source ends first."""
    while size:
        try:
            moved = os.splice(source_fd, target_fd, size, flags=os.SPLICE_F_MOVE)
        except BlockingIOError:
            _wait(wait_fd, events, timeout)
            continue
        if moved == 0:
            raise Broken("the body ended inside a chunk")
        size -= moved


def send_from_pipe(pipe_fd, sock_fd, timeout):
    """What the pipe gives until its writer closes it, as chunks (the last, empty one not
    sent: the caller sends END once the writer ended well); the bytes sent."""
    waiting = bytearray(4)
    sent = 0
    while True:
        _wait(pipe_fd, select.POLLIN, timeout)
        fcntl.ioctl(pipe_fd, termios.FIONREAD, waiting)
        size = min(int.from_bytes(waiting, "little"), CHUNK)
        if size == 0:  # readable and empty: the writer closed it
            return sent
        send_bytes(sock_fd, b"%x\r\n" % size, timeout)
        _splice(pipe_fd, sock_fd, size, sock_fd, select.POLLOUT, timeout)
        send_bytes(sock_fd, b"\r\n", timeout)
        sent += size


def _line(sock, limit):
    """A line of the framing, and nothing of the chunk's data after it (that is spliced):
    read whole when it is in the socket's buffer (as it is but when it came apart), else
    a byte at a time."""
    peeked = sock.recv(limit, socket.MSG_PEEK)
    end = peeked.find(b"\r\n")
    if end >= 0:
        return sock.recv(end + 2)  # in the buffer: all of it comes
    line = b""
    while not line.endswith(b"\r\n"):
        if len(line) >= limit:
            raise Broken("not a chunked body: a line too long")
        byte = sock.recv(1)
        if not byte:
            raise Broken("the body ended inside a chunk's framing")
        line += byte
    return line


def _size(sock):
    line = _line(sock, SIZE_LINE_MAX)
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise Broken(f"not a chunked body: size line {line[:20]!r}") from None


def receive_into_pipe(sock, pipe_fd, timeout, on_bytes=None):
    """A chunked body from `sock` (a socket whose response headers were read, nothing
    more) into the pipe until its last chunk; on_bytes(size) after each chunk. Broken when
    the body is cut off or malformed; BrokenPipeError when the pipe's reader ended."""
    received = 0
    while size := _size(sock):
        _splice(sock.fileno(), pipe_fd, size, sock.fileno(), select.POLLIN, timeout)
        if _line(sock, 2) != b"\r\n":
            raise Broken("not a chunked body: no CRLF after a chunk")
        received += size
        if on_bytes is not None:
            on_bytes(size)
    while _line(sock, TRAILER_LINE_MAX) != b"\r\n":  # trailer fields, to the blank line
        pass
    return received
