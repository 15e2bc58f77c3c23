"""docs/make_screenshot.py's wait: the engine's Python threads run at full speed while the script waits.

Its first version waited with QSignalSpy.wait, which keeps Python's GIL for the whole wait: the TTS and
the audio callback (Python threads) then crawled and the live run stuck on the first clause, CPU idle.
"""

import importlib.util
import threading
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "make_screenshot.py"


def load_script():
    spec = importlib.util.spec_from_file_location("make_screenshot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_waiting_leaves_the_gil_to_the_engines_threads(qapp):
    """A thread that needs the GIL back 1,000 times (as the audio callback does every 20 ms) finishes during one
    wait: holding the GIL between 50 ms ticks would take it 50 s, past the 30 s limit."""
    script = load_script()
    done = threading.Event()

    def handoffs():
        for _ in range(1000):
            time.sleep(0.001)  # gives the GIL up and must take it back
        done.set()

    thread = threading.Thread(target=handoffs)
    thread.start()
    try:
        script.wait_until(done.is_set, 30, "the thread's 1,000 GIL handoffs")
    finally:
        thread.join()


def test_a_wait_that_runs_out_says_what_it_waited_for(qapp):
    """A condition that never holds ends the script with SystemExit naming what it waited for."""
    import pytest

    script = load_script()
    with pytest.raises(SystemExit, match="timed out after 0 s waiting for the moon"):
        script.wait_until(lambda: False, 0.2, "the moon")
