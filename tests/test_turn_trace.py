"""bench/turn_trace.py keeps up with the engine: the methods it wraps exist, and its labels read what they return."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# in a process of its own: the trace wraps the engine's classes for good
TRACED_READING = """
import sys
sys.path.insert(0, "bench")
from turn_trace import Trace
Trace().install()
from engine.stt.turn_text import TextTurnModel
reading = TextTurnModel(threads=1).reading("It is raining outside.")
print(f"{reading.whole:.4f} {reading.sentence:.4f}")
"""


def test_the_trace_installs_and_labels_a_reading_of_the_bundled_reader():
    done = subprocess.run([sys.executable, "-c", TRACED_READING], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    whole, sentence = (float(v) for v in done.stdout.split())
    assert 0 <= whole <= 1 and 0 < sentence <= 1
