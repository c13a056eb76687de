"""The web process: daphne, serving backendai_web.asgi:application, on uvloop's event loop.

`python -m backendai_web.web [daphne's options] backendai_web.asgi:application` is the
`daphne` command with one change made before daphne creates its loop: uvloop's loop
under Twisted's asyncio reactor. A status change fans out to every connected browser as
one websocket frame each, and each frame costs the loop a write and a register/unregister
of its socket; on uvloop that bookkeeping is C, not Python (see BENCHMARKS.md).
"""

import asyncio

import uvloop


def main():
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    from daphne.cli import CommandLineInterface  # creates daphne's loop: after the policy

    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
