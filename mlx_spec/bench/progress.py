"""A progress bar on stderr: tqdm when installed, else a plain status line."""

import sys
import time
from typing import Optional


class Progress:
    """``start(total, label)``, ``update(text)`` per step, ``close()``; ``note(text)``."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._bar = None
        self._total = 0
        self._done = 0
        self._label = ""
        self._tic = 0.0

    def start(self, total: int, label: str) -> None:
        self.close()
        self._total, self._done, self._label = total, 0, label
        self._tic = time.perf_counter()
        if not self.enabled or total <= 0:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
            return
        self._bar = tqdm(
            total=total, desc=label, file=sys.stderr, leave=False, dynamic_ncols=True
        )

    def update(self, text: Optional[str] = None) -> None:
        self._done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            if text:
                self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(1)
            return
        elapsed = time.perf_counter() - self._tic
        line = (
            f"\r{self._label}: {self._done}/{self._total} ({elapsed:.0f}s) {text or ''}"
        )
        sys.stderr.write(line[:120].ljust(120))
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self._total:
            elapsed = time.perf_counter() - self._tic
            sys.stderr.write(
                f"\r{self._label}: {self._done}/{self._total} done in "
                f"{elapsed:.0f}s".ljust(120) + "\n"
            )
            sys.stderr.flush()
        self._total = 0

    def note(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)
