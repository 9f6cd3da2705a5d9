"""Stop signals: once a process is done, a late SIGTERM finds no handler writing to a closing loop's pipe."""

from __future__ import annotations

import signal

from rlgate.service.process import ignore_stop_signals, on_stop_signals

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def test_ignoring_stop_signals_leaves_no_wakeup_fd_behind() -> None:
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    stops: list[int] = []
    try:
        on_stop_signals(lambda: stops.append(1))
        ignore_stop_signals()
        # The loop's handlers are gone with its wakeup pipe: nothing is written to it as asyncio.run closes it.
        assert signal.set_wakeup_fd(-1) == -1
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in STOP_SIGNALS)
        signal.raise_signal(signal.SIGTERM)  # ignored
        assert stops == []
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
