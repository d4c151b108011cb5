"""Progress of a script that runs many replays: `[k/N] replays, ETA mm:ss` on stderr.

Shared by scripts/selector_goal.py and scripts/tiered_tables.py (imported from the scripts'
own directory, which Python puts first on sys.path).
"""
import math
import sys
import time


def mm_ss(seconds):
    seconds = max(0, int(math.ceil(seconds)))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


class Progress:
    """`[k/N] replays, ETA mm:ss` on stderr. On a terminal one line rewritten in place after every
    finished replay; otherwise a plain line each time another ~10 % is done. The ETA is the mean
    time per finished replay times the replays left, over the replays that run at once."""

    def __init__(self, total, jobs, stream=sys.stderr):
        self.total, self.jobs, self.stream = total, max(1, jobs), stream
        self.tty = stream.isatty()
        self.finished, self.seconds, self.width, self.tenths = 0, 0.0, 0, 0
        self.start = time.monotonic()

    def eta(self):
        left = self.total - self.finished
        if not left:
            return 0.0
        return self.seconds / self.finished * left / min(self.jobs, left)

    def line(self):
        return f"[{self.finished}/{self.total}] replays, ETA {mm_ss(self.eta()) if self.finished else '--:--'}"

    def begin(self):
        if self.tty and self.total:
            self.show(self.line())

    def show(self, text):
        self.stream.write("\r" + text.ljust(self.width))
        self.width = max(self.width, len(text))
        self.stream.flush()

    def step(self, seconds):
        self.finished += 1
        self.seconds += seconds
        if self.tty:
            self.show(self.line())
        elif self.finished * 10 // self.total > self.tenths and self.finished < self.total:
            self.tenths = self.finished * 10 // self.total
            print(self.line(), file=self.stream, flush=True)

    def end(self):
        if not self.total:
            return
        took = f"[{self.finished}/{self.total}] replays in {mm_ss(time.monotonic() - self.start)}"
        if self.tty:
            self.show(took)
            self.stream.write("\n")
        elif self.finished == self.total:
            print(took, file=self.stream)
        self.stream.flush()
