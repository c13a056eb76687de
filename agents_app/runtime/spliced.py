"""HTTP/1.1 chunked bodies whose large parts the kernel moves: a file's bytes from the page
cache into a socket (sendfile(2)), a body's bytes from a socket into a pipe (splice(2));
Python writes and reads the chunks' size lines and the small parts. A kept volume crosses
this way from the source's files to the target's `tar -x` (kept.send_volume, kept_fetch.py):
relayed through Python's reads and writes, a GiB took 0.4–1.2 s more than `tar -c | tar -x`
alone (docs/benchmarks/resume.md).

The chunked framing is kept for what it tells the receiver: the last, empty chunk is sent
only once the source has read all it sends, so a body cut off anywhere (a file that could
not be read, an agent that died) never passes for a whole one. Both sockets may be
non-blocking (the source's belongs to the stream endpoint's event loop, the target's has a
timeout): a call that would block waits in poll(2), up to `timeout` seconds without
progress."""

import os
import select
import socket

CHUNK = 1024 * 1024  # the most a chunk of a file carries: a pipe's size (kept.bigger_pipe)
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
            written = os.write(sock_fd, view)
            view = view[written:]
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


def send_chunk(sock_fd, data, timeout):
    """`data` as one chunk (none when it is empty); its size."""
    if data:
        send_bytes(sock_fd, b"%x\r\n%s\r\n" % (len(data), data), timeout)
    return len(data)


def send_file(sock_fd, file_fd, size, timeout):
    """`size` bytes of the file from its start, in chunks of CHUNK sent from the page
    cache (sendfile(2)); Broken when the file is shorter. Its size."""
    offset = 0
    while offset < size:
        length = min(CHUNK, size - offset)
        send_bytes(sock_fd, b"%x\r\n" % length, timeout)
        end = offset + length
        while offset < end:
            try:
                sent = os.sendfile(sock_fd, file_fd, offset, end - offset)
            except BlockingIOError:
                _wait(sock_fd, select.POLLOUT, timeout)
                continue
            if sent == 0:
                raise Broken("the file ended before its size: it changed while it was read")
            offset += sent
        send_bytes(sock_fd, b"\r\n", timeout)
    return size


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
