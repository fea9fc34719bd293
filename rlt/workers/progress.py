"""What the heartbeat thread reads to tell a slow step from a stuck worker.

`count` moves with every main-loop iteration and with every layer a pass runs (the runner's
attention), so a long prompt chunk keeps it moving while a hung loop or kernel does not; `busy`
says the main loop has work; `trouble()` says what keeps the worker from serving though it beats
(its grammar compiles stuck). Plain class attributes: written by the main thread, read by the
heartbeat thread (an int read is atomic under the GIL).
"""


class Progress:
    count = 0
    busy = False
    trouble = staticmethod(lambda: None)  # -> a reason the worker cannot serve, or None
