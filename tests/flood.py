#!/usr/bin/env python3
"""tests/flood.py: unauthenticated clients against a rank's port.

  flood.py idle HOST PORT N SECONDS   hold N idle connections, reopening
                                      each one the moment it is dropped
  flood.py churn HOST PORT SECONDS    connect and close as fast as possible

Prints what it did on exit ("idle: 256 held, 1234 reopened"); idle also
says when its N connections are open ("idle: 256 opened").
"""
import errno
import selectors
import socket
import sys
import time


def opener(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect((host, port))
    except BlockingIOError:
        pass
    except OSError as e:
        if e.errno not in (errno.EINPROGRESS, errno.EAGAIN):
            s.close()
            return None
    return s


def idle(host, port, n, seconds):
    sel = selectors.DefaultSelector()
    held = 0
    reopened = 0
    end = time.monotonic() + seconds
    for _ in range(n):
        s = opener(host, port)
        if s:
            sel.register(s, selectors.EVENT_READ)
            held += 1
    # the caller waits for this line before it counts on the flood
    print("idle: %d opened" % held, flush=True)
    while time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            s = key.fileobj
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if data:
                continue  # whatever the server says, we say nothing
            sel.unregister(s)
            s.close()
            held -= 1
        while held < n and time.monotonic() < end:
            s = opener(host, port)
            if not s:
                break
            sel.register(s, selectors.EVENT_READ)
            held += 1
            reopened += 1
    print("idle: %d held, %d reopened" % (held, reopened))


def churn(host, port, seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect((host, port))
            n += 1
        except OSError:
            pass
        s.close()
    print("churn: %d connections" % n)


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "idle":
        idle(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
             float(sys.argv[5]))
    elif len(sys.argv) == 5 and sys.argv[1] == "churn":
        churn(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
