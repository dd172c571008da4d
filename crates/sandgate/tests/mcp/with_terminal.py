"""Runs a command (an MCP server) with a terminal as its controlling terminal, as a server
has when the agent client was started in a person's terminal and did not detach it.

argv: [--stderr] COMMAND...  A new pseudo-terminal is made and taken as the controlling
terminal of this process's session (the Python MCP SDK starts a server in a new session of
its own, without one); the command runs in that session with its stdin and stdout untouched
(the protocol's pipes) and, with --stderr, the terminal as its stderr (a client that lets
its servers write their log to the terminal it runs in). This process reads what reaches
the terminal, so no writer ever blocks on it, and exits with the command's status. The
test harness may have no terminal at all (CI has no stdin), so this makes one.
"""
import fcntl
import os
import sys
import termios

args = sys.argv[1:]
to_stderr = args[:1] == ["--stderr"]
if to_stderr:
    args = args[1:]
master, slave = os.openpty()
if os.getsid(0) != os.getpid():
    os.setsid()
fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
pid = os.fork()
if pid == 0:
    os.close(master)
    if to_stderr:
        os.dup2(slave, 2)
    os.close(slave)
    os.execvp(args[0], args)
os.close(slave)
os.close(0)
os.close(1)
while True:
    try:
        if not os.read(master, 65536):
            break
    except OSError:  # EIO: no one holds the terminal any more
        break
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
