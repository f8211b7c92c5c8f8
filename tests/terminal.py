"""A terminal for the tests: a pseudo-terminal to run a command in as a person would, and a
small emulator of what matters here (text, carriage returns, line feeds, cursor moves and
erasures; colours ignored), so tests count the lines a person sees at the end, not the bytes
written."""

from __future__ import annotations

import os
import re
import select
import struct
import time
from pathlib import Path

import pytest

ROWS, COLS = 40, 120
_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z@`])")
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def screen(output: str, cols: int = COLS) -> list[str]:
    """The lines a terminal ``cols`` wide shows after ``output`` (scrollback included),
    trailing blank lines dropped. Handles printable text (wrapping at ``cols``), ``\\r``,
    ``\\n``, ``\\b``, cursor up/down/forward/back/column, and line/screen erasure."""
    lines: list[list[str]] = [[]]
    row = col = 0
    output = _OSC.sub("", output)
    i = 0
    while i < len(output):
        ch = output[i]
        match = _CSI.match(output, i) if ch == "\x1b" else None
        if match:
            i = match.end()
            params, code = match.group(1), match.group(2)
            n = int(params) if params.isdigit() else None
            if code == "A":
                row = max(0, row - (n or 1))
            elif code == "B":
                row += n or 1
            elif code == "C":
                col += n or 1
            elif code == "D":
                col = max(0, col - (n or 1))
            elif code == "G":
                col = (n or 1) - 1
            elif code == "K":
                while len(lines) <= row:
                    lines.append([])
                line = lines[row]
                if n == 2:
                    line.clear()
                elif n == 1:
                    line[:col] = [" "] * min(col, len(line))
                else:
                    del line[col:]
            elif code == "J" and n in (None, 0):
                del lines[row + 1:]
                if row < len(lines):
                    del lines[row][col:]
            continue  # colours, cursor visibility, ...: nothing to see
        i += 1
        if ch == "\x1b":
            continue  # a lone escape
        if ch == "\r":
            col = 0
        elif ch == "\n":  # as a terminal's line discipline sends it (ONLCR): \r\n
            row, col = row + 1, 0
        elif ch == "\b":
            col = max(0, col - 1)
        elif ch >= " " or ch == "\t":
            if col >= cols:
                row, col = row + 1, 0
            while len(lines) <= row:
                lines.append([])
            line = lines[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
        while len(lines) <= row:
            lines.append([])
    text = ["".join(line).rstrip() for line in lines]
    while text and not text[-1]:
        text.pop()
    return text


def run_in_a_pty(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    import fcntl
    import pty
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child, in a terminal ROWS x COLS, as a person's
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        finally:  # never back into pytest
            os._exit(127)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        else:
            os.kill(pid, 9)
            pytest.fail("the command did not finish in time:\n" + b"".join(chunks).decode(
                "utf-8", "replace")[-3000:])
    finally:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
    output = b"".join(chunks).decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 0, output[-3000:]
    return output
