"""Ctrl-C heard as an event within ``with``, the previous handler put back after."""

import signal


class SigintCaught:
    """Within ``with``, SIGINT calls :meth:`caught` instead of raising.

    Outside the main thread (where Python allows no signal handlers), or where
    SIGINT is ignored (a background job, a sharded chat's other ranks), it
    changes nothing.
    """

    def __init__(self):
        self._previous = None
        self._installed = False

    def caught(self):
        """What a SIGINT does while entered."""
        raise NotImplementedError

    def _handle(self, signum, frame):
        self.caught()

    def __enter__(self):
        try:
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                self._previous = signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        except ValueError:  # not the main thread
            pass
        return self

    def __exit__(self, *exc):
        if self._installed:
            # None: a handler not set from Python, which cannot be put back.
            previous = signal.SIG_DFL if self._previous is None else self._previous
            signal.signal(signal.SIGINT, previous)
            self._installed = False
        return False
