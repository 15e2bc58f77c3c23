"""Soak of the live voice loop: a scripted N-turn conversation (default 200) with seeded random barge-ins,
checked for lost or duplicated turns, memory growth and thread or file-handle leaks.

Method: the parts of bench/voice_loop.py (its private PulseAudio with the 'vsink' speakers and the
'usermic' microphone, espeak-ng's voice) drive the real loop: engine/voice_loop.py hands-free, Silero VAD,
the end-of-turn models of the voice and of the words with the reply begun in the pause (the app's defaults;
--fixed-window: a fixed pause ends each turn instead), Whisper base, SmolLM2-135M-Instruct (greedy, 1 thread), a
random tiny Qwen3-TTS checkpoint
(<= --max-frames frames a clause) speaking through the Player, a SQLite history file. Each turn is a
line spoken into the microphone or, for a seeded --typed share, typed (submit_text). --barge-ins
turns, drawn with --seed, are talked over: once their reply's first clause is playing (plus a
seeded 0..--barge-delay-s), the next line is spoken, the VAD hears it, the reply stops (BargeIn) and
that speech is the next turn; a barge-in turn's line asks for a long reply. Otherwise the next line
starts once the loop is listening again.

Measured: the process's RSS (/proc/self/statm), threads (/proc/self/task by name, and Python's), open file
descriptors (/proc/self/fd), after gc.collect(), at the end of each turn after the --warm-up turns
when the loop is listening (not while a barge-in turn runs); also before the audio devices, history
and loop are opened (the models loaded and run once) and after all are closed. The figures are
engine/metrics.py's over the turns after the warm-up. The driver keeps the loop's small events only
(no Level or ReplyText), so its own bookkeeping stays far below the memory bound.

Checked at the end, from the SQLite file through a fresh read-only connection (exit 1 if one fails):
every scripted turn gave exactly one TurnFinished and no TurnFailed; the file holds one conversation
whose rows are the reported turns exactly, in order (text, interrupted, heard part, figures); each
interrupted reply was trimmed to clauses that had started playing, a clause prefix of what the LLM
wrote; the LLM's history is what the file says was said; RSS grew less than --max-growth-mb from the
end of the warm-up to the last turn; threads and descriptors at the last turn equal those at the end
of the warm-up, and after closing equal those before opening. SIGINT/SIGTERM stops after the running
turn and checks the turns done. Writes report.json, report.md and history.sqlite3 into --out.

    python bench/soak.py --out /tmp/soak                          # 200 turns, 25 barge-ins
    python bench/soak.py --out /tmp/soak-small --turns 12 --barge-ins 3 --warm-up 2
Needs the Debian packages pulseaudio, pulseaudio-utils, libasound2-plugins and espeak-ng (.ci/run).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.voice_loop import ROWS, SCRIPT, Pulse, random_checkpoint, speech  # noqa: E402

# asked of a turn that gets talked over: a reply of many clauses is still playing when the VAD hears the user
LONG = [
    "Tell me a long story about a cat and a dog.",
    "Describe your perfect holiday in detail.",
    "Explain how a train works, step by step.",
    "Tell me a long story about a dragon and a knight.",
    "Describe a busy city market in the morning.",
]


@dataclass(frozen=True)
class Step:
    """One scripted turn: its line, spoken or typed, and whether the user talks over its reply."""

    line: str
    spoken: bool
    barge_in: bool  # the next step is spoken while this turn's reply plays


def plan(turns: int, barge_ins: int, typed_share: float, seed: int) -> list[Step]:
    """The scripted turns; a barge-in is never on the last turn, and the turn after one is spoken."""
    rng = random.Random(seed)
    targets = set(rng.sample(range(turns - 1), barge_ins))
    steps = []
    for i in range(turns):
        typed = rng.random() < typed_share and i - 1 not in targets
        line = LONG[len(steps) % len(LONG)] if i in targets else SCRIPT[i % len(SCRIPT)]
        steps.append(Step(line, spoken=not typed, barge_in=i in targets))
    return steps


def thread_names() -> list[str]:
    """The names of the process's kernel tasks (its threads; a native pool's workers share the process's name)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except FileNotFoundError:  # it ended while being listed
            pass
    return sorted(names)


def sample() -> dict:
    """The process's RSS (MB), threads (kernel tasks, by name, and Python threads) and open file descriptors now."""
    gc.collect()  # what is still held, not garbage waiting for a collection
    # threads that a turn's end is winding down (a native pool leaves a moment after its thread) are not the ones
    # that stay: the names are taken once they hold for 0.2 s
    names = thread_names()
    for _ in range(10):
        time.sleep(0.2)
        names, before = thread_names(), names
        if names == before:
            break
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return {
        "rss_mb": pages * os.sysconf("SC_PAGE_SIZE") / 2**20,
        "threads": len(names),
        "thread_names": dict(Counter(names)),
        "python_threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
    }


class Events:
    """The loop's events in order (no Level or ReplyText), with waits that wake on each new one. A finished turn is
    kept without its reply's audio (TurnResult.audio, about 100 KB a second of speech): a driver that held every
    turn's would grow by it, and the memory check would measure the driver."""

    def __init__(self):
        self.seen: list = []
        self.ends: list[int] = []  # where in `seen` each TurnFinished or TurnFailed is
        self._changed = threading.Condition()

    def __call__(self, event) -> None:
        from engine.events import Level, ReplyText, TurnFailed, TurnFinished

        if isinstance(event, Level | ReplyText):
            return
        if isinstance(event, TurnFinished):
            event = TurnFinished(dataclasses.replace(event.result, audio=np.zeros(0, np.float32)))
        with self._changed:
            self.seen.append(event)
            if isinstance(event, TurnFinished | TurnFailed):
                self.ends.append(len(self.seen) - 1)
            self._changed.notify_all()

    def wait(self, predicate, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(predicate, timeout_s)

    def of_turn(self, i: int, kind) -> list:
        """Events of `kind` of the i-th turn to end (or of the turn running now, if i is the next)."""
        with self._changed:
            start = self.ends[i - 1] + 1 if i > 0 else 0
            end = self.ends[i] if i < len(self.ends) else len(self.seen)
            return [e for e in self.seen[start:end] if isinstance(e, kind)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for report.json, report.md and history.sqlite3")
    parser.add_argument("--turns", type=int, default=200, help="scripted turns, warm-up included")
    parser.add_argument("--barge-ins", type=int, default=25, help="turns the user talks over")
    parser.add_argument("--typed", type=float, default=0.25, help="share of turns typed instead of spoken")
    # 30: every scripted line said once (25) and the LLM's first history trim (n_ctx 1024: turn ~26)
    # done, so the buffers that grow to a high-water mark (llama.cpp, CTranslate2, the allocator's
    # arenas) have reached it; docs/lab/BENCHMARKS-LOG.md has a run's whole RSS curve
    parser.add_argument("--warm-up", type=int, default=30, help="turns before sampling and scoring start")
    parser.add_argument("--seed", type=int, default=0, help="draws the barge-ins, typed turns and delays")
    parser.add_argument("--barge-delay-s", type=float, default=1.0, help="longest wait after the first clause")
    parser.add_argument("--max-frames", type=int, default=12, help="TTS frames per clause cap (random weights)")
    parser.add_argument("--max-tokens", type=int, default=48, help="longest LLM reply")
    parser.add_argument("--n-ctx", type=int, default=1024, help="LLM context; the history is trimmed to fit")
    parser.add_argument("--fixed-window", action="store_true",
                        help="end each turn after --silence-ms of silence, without the end-of-turn models")
    parser.add_argument("--silence-ms", type=int, default=700, help="the fixed window's pause")
    parser.add_argument("--longest-pause-ms", type=int, default=2000,
                        help="with the end-of-turn models: the pause that ends a turn whatever they say")
    parser.add_argument("--max-growth-mb", type=float, default=50.0, help="RSS growth allowed after the warm-up")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="longest wait for one turn")
    parser.add_argument("--echo-cancellation", action="store_true",
                        help="run the loop's echo canceller, as the app does by default "
                             "(off: the microphone is a headset)")
    parser.add_argument("--whisper", help="a CTranslate2 Whisper folder (default: the bundled base)")
    args = parser.parse_args(argv)
    if not 1 <= args.warm_up < args.turns:
        parser.error(f"--warm-up must be in 1..turns-1 ({args.turns - 1}), got {args.warm_up}")
    if not 0 <= args.barge_ins < args.turns:
        parser.error(f"--barge-ins must be in 0..turns-1 ({args.turns - 1}), got {args.barge_ins}")
    if not 0 <= args.typed <= 1:
        parser.error(f"--typed is a share in 0..1, got {args.typed}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("history.sqlite3", "history.sqlite3-wal", "history.sqlite3-shm"):
        (out / name).unlink(missing_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    work = Path(tempfile.mkdtemp(prefix="parley-soak-"))
    pulse = Pulse()  # before sounddevice is imported: PortAudio lists devices once
    try:
        report = soak(args, pulse, work, out, stop)
    finally:
        pulse.stop()
        shutil.rmtree(work, ignore_errors=True)
    report["command"] = "python bench/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    markdown = to_markdown(report)
    (out / "report.md").write_text(markdown)
    print(markdown)
    return 0 if all(c["ok"] for c in report["invariants"]) else 1


def soak(args, pulse: Pulse, work: Path, out: Path, stop: threading.Event) -> dict:
    from engine.audio import Microphone, Player, list_devices
    from engine.audio.echo import EchoCanceller
    from engine.dialogue import Dialogue, DialogueOptions
    from engine.events import BargeIn, SpeakingClause, TurnFinished
    from engine.history import HistoryStore
    from engine.listening import VoiceOptions
    from engine.llm.chat import ChatModel, ChatOptions, bundled_model_path
    from engine.llm.clauses import ClauseOptions
    from engine.metrics import MetricsRecorder
    from engine.stt import SileroVad, Transcriber, TranscriberOptions, VadOptions
    from engine.stt.turn import TurnModel, default_threads
    from engine.stt.turn_text import TextTurnModel
    from engine.tts import load_tts
    from engine.voice_loop import VoiceLoop

    t0 = time.perf_counter()
    steps = plan(args.turns, args.barge_ins, args.typed, args.seed)
    rng = random.Random(args.seed + 1)  # the barge-in delays
    tts = load_tts(random_checkpoint(work, "tiny", args.max_frames), device="cpu")
    chat = ChatModel(bundled_model_path(), ChatOptions(n_ctx=args.n_ctx, max_tokens=args.max_tokens, temperature=0.0,
                                                       n_threads=1, n_gpu_layers=0))
    transcriber = Transcriber(args.whisper, TranscriberOptions(device="cpu", cpu_threads=2))
    vad = SileroVad()
    turn_model = text_model = None
    if not args.fixed_window:
        turn_model, text_model = TurnModel(), TextTurnModel(threads=default_threads())
        turn_model.probability(np.zeros(16000, np.float32))
        text_model.reading("Hello.")
    voices = {s.line: speech(s.line, work) for s in steps if s.spoken}
    # each part runs once before the baseline, so the threads and buffers they keep are in it
    transcriber.warm_up()
    tts.synthesize("Hello there.", tts.default_speaker)
    list(chat.stream_reply("Hello."))
    chat.clear_history()
    vad.probability(np.zeros(512, np.float32))
    list_devices("output")  # PortAudio's own start-up, once per process
    EchoCanceller()  # livekit's runtime starts with the first one (4 threads, 10 fds) and stays
    print(f"loaded in {time.perf_counter() - t0:.0f} s; {args.turns} turns, "
          f"{sum(s.barge_in for s in steps)} barge-ins, {sum(not s.spoken for s in steps)} typed", file=sys.stderr)

    # many short clauses: each is at most --max-frames of speech, so a reply lasts long enough to be
    # talked over, and the trim has clause borders to fall on
    clauses = ClauseOptions(min_first_words=1, min_words=2)
    history_file = out / "history.sqlite3"
    events = Events()
    samples: list[dict] = []
    before_open = sample()
    done = 0  # turns driven to their end
    timed_out = None
    t_start = time.perf_counter()
    with Player() as player, Microphone() as mic, HistoryStore(history_file) as history:
        dialogue = Dialogue(chat, tts, player, history, transcriber, metrics=MetricsRecorder(window=args.turns),
                            options=DialogueOptions(tts_seed=args.seed, clauses=clauses))
        # the user's microphone is a null sink of its own (a headset): no echo to cancel, but the
        # canceller still runs with --echo-cancellation (its memory and threads are soaked too)
        silence_ms = args.silence_ms if args.fixed_window else args.longest_pause_ms
        options = VoiceOptions(vad=VadOptions(silence_ms=silence_ms), echo_cancellation=args.echo_cancellation)
        with VoiceLoop(dialogue, mic, options, vad=vad, turn_model=turn_model, text_model=text_model) as loop:
            loop.subscribe(events)
            loop.start()
            talked_over = None  # the barge-in speech of this turn, started during the previous one
            for i, step in enumerate(steps):
                if stop.is_set() and talked_over is None:
                    break
                if i == args.warm_up:
                    dialogue.metrics = MetricsRecorder(window=args.turns)  # warm-up turns are not scored
                if talked_over is not None:
                    talked_over.wait()
                elif step.spoken:
                    pulse.play(voices[step.line]).wait()
                else:
                    loop.submit_text(step.line)
                talked_over = None
                if step.barge_in:
                    events.wait(lambda: events.of_turn(i, SpeakingClause) or len(events.ends) > i, args.timeout_s)
                    if len(events.ends) == i and events.of_turn(i, SpeakingClause):
                        time.sleep(rng.uniform(0, args.barge_delay_s))
                        talked_over = pulse.play(voices[steps[i + 1].line])
                if not events.wait(lambda: len(events.ends) > i, args.timeout_s):
                    timed_out = f"turn {i}: no result within {args.timeout_s:.0f} s"
                    break
                done = i + 1
                if talked_over is None:
                    events.wait(lambda: loop.state == "listening", args.timeout_s)
                    if i >= args.warm_up - 1:
                        samples.append({"turn": i, **sample()})
                print(progress(i, steps, events), file=sys.stderr, flush=True)
            if talked_over is not None:  # a turn timed out while the next line was being spoken
                talked_over.wait()
    after_close = sample()
    wall_s = time.perf_counter() - t_start

    results = [events.seen[k] for k in events.ends]
    turns = []
    for i, event in enumerate(results):
        row = {"turn": i, "kind": ("spoken" if steps[i].spoken else "typed") if i < len(steps) else "extra",
               "line": steps[i].line if i < len(steps) else None, "barge_in": i < len(steps) and steps[i].barge_in}
        if isinstance(event, TurnFinished):
            r = event.result
            row |= {"user_text": r.user_text, "reply_text": r.reply_text, "heard_text": r.heard_text,
                    "interrupted": r.interrupted, "metrics": r.metrics.as_dict(),
                    "started_clauses": [c.text for c in events.of_turn(i, SpeakingClause)]}
        else:
            row |= {"failed": event.message}
        turns.append(row)

    summary = dialogue.metrics.summary()
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "args": vars(args),
        "scripted": done,
        "stopped_early": timed_out or ("signal" if done < args.turns else None),
        "wall_s": wall_s,
        "barge_ins": {"scheduled": sum(s.barge_in for s in steps[:done]),
                      "landed": sum(bool(t.get("interrupted")) for t in turns),
                      "events": sum(isinstance(e, BargeIn) for e in events.seen)},
        "before_open": before_open,
        "after_close": after_close,
        "samples": samples,
        "figures": {name: {"count": f.count, "p50": f.p50, "p95": f.p95} for name, f in summary.items()},
        "turns": turns,
    }
    report["invariants"] = check(report, history_file, chat.history, clauses, args.max_growth_mb)
    return report


def progress(i: int, steps: list[Step], events: Events) -> str:
    from engine.events import TurnFinished

    event = events.seen[events.ends[i]]
    what = f"turn {i + 1}/{len(steps)} {'spoken' if steps[i].spoken else 'typed'}"
    if not isinstance(event, TurnFinished):
        return f"{what}: FAILED {event.message}"
    r = event.result
    cut = f", talked over after {len(r.heard_text.split())} words" if r.interrupted else ""
    return f"{what}: {r.user_text!r} -> {len(r.reply_text.split())} words{cut}"


def check(report: dict, history_file: Path, llm_history: list[dict], clauses, max_growth_mb: float) -> list[dict]:
    """The soak's invariants, each {"name", "ok", "detail"}."""
    from engine.llm.clauses import split_clauses

    checks = []

    def invariant(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail})

    turns, scripted = report["turns"], report["scripted"]
    failed = [t for t in turns if "failed" in t]
    timed_out = report["stopped_early"] not in (None, "signal")
    invariant("every turn answered once", len(turns) == scripted and not failed and not timed_out,
              f"{len(turns) - len(failed)} finished and {len(failed)} failed of {scripted} scripted"
              + (f"; first failure: turn {failed[0]['turn']}: {failed[0]['failed']}" if failed else "")
              + (f"; {report['stopped_early']}" if timed_out else ""))

    expected = []
    for t in turns:
        if "failed" in t:
            continue
        if t["user_text"]:
            expected.append(("user", t["user_text"], None, False, {}))
        if t["reply_text"].strip():
            expected.append(("assistant", t["reply_text"], t["heard_text"] if t["interrupted"] else None,
                             t["interrupted"], t["metrics"]))
    with sqlite3.connect(f"file:{history_file}?mode=ro", uri=True) as db:
        conversations = db.execute("SELECT id FROM conversations").fetchall()
        rows = [(role, text, heard, bool(interrupted), json.loads(metrics)) for role, text, heard, interrupted, metrics
                in db.execute("SELECT role, text, heard_text, interrupted, metrics FROM turns ORDER BY id")]
    db.close()
    first_diff = next((k for k, (a, b) in enumerate(zip(rows, expected)) if a != b), min(len(rows), len(expected)))
    detail = f"{len(rows)} rows in {len(conversations)} conversation(s), {len(expected)} expected"
    if rows != expected:
        detail += (f"; first difference at row {first_diff}: saved {rows[first_diff:first_diff + 1]}, "
                   f"reported {expected[first_diff:first_diff + 1]}")
    invariant("history file holds the reported turns exactly, in order", len(conversations) == 1 and rows == expected,
              detail)

    bad = []
    cut = [t for t in turns if t.get("interrupted")]
    for t in cut:
        started = t["started_clauses"]
        prefixes = [" ".join(started[:k]) for k in range(len(started) + 1)]
        if t["heard_text"] not in prefixes \
                or not " ".join(split_clauses(t["reply_text"], clauses)).startswith(t["heard_text"]):
            bad.append(t["turn"])
    invariant("talked-over replies trimmed to what was heard",
              not bad and (cut or not report["barge_ins"]["scheduled"]),
              f"{len(cut)} interrupted of {report['barge_ins']['scheduled']} talked over"
              + (f"; not a heard prefix: turns {bad}" if bad else ""))

    said = [{"role": role, "content": heard if interrupted and heard is not None else text}
            for role, text, heard, interrupted, _ in rows]
    said = [m for m in said if m["role"] == "user" or m["content"].strip()]  # an unheard reply is not in the LLM's
    invariant("the LLM's history is what the file says was said", llm_history == said,
              f"{len(llm_history)} LLM messages, {len(said)} said")

    samples = report["samples"]
    if len(samples) >= 2:
        first, last = samples[0], samples[-1]
        growth = last["rss_mb"] - first["rss_mb"]
        invariant(f"RSS growth after the warm-up < {max_growth_mb:g} MB", growth < max_growth_mb,
                  f"{first['rss_mb']:.1f} MB after turn {first['turn'] + 1} -> {last['rss_mb']:.1f} MB after turn "
                  f"{last['turn'] + 1} ({growth:+.1f} MB; peak {max(s['rss_mb'] for s in samples):.1f} MB)")
        steady = all(first[k] == last[k] for k in ("threads", "python_threads", "fds"))
        invariant("threads and fds steady while running", steady,
                  ", ".join(f"{k} {first[k]} -> {last[k]}" for k in ("threads", "python_threads", "fds"))
                  + threads_changed(first, last))
    else:
        invariant("RSS, threads and fds sampled", False, f"{len(samples)} sample(s): too few turns after the warm-up")
    b, a = report["before_open"], report["after_close"]
    invariant("threads and fds back to the baseline after close",
              all(b[k] == a[k] for k in ("threads", "python_threads", "fds")),
              ", ".join(f"{k} {b[k]} -> {a[k]}" for k in ("threads", "python_threads", "fds")) + threads_changed(b, a))
    return checks


def threads_changed(before: dict, after: dict) -> str:
    """'; threads +2 python, -1 threaded-ml': the named threads whose number differs between two samples."""
    names = sorted(before["thread_names"].keys() | after["thread_names"].keys())
    changes = [f"{n:+d} {name}" for name in names
               if (n := after["thread_names"].get(name, 0) - before["thread_names"].get(name, 0))]
    return f"; threads {', '.join(changes)}" if changes else ""


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    return f"{cpu}, {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the end"


def figure(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def to_markdown(report: dict) -> str:
    a = report["args"]
    spoken = sum(t["kind"] == "spoken" for t in report["turns"])
    lines = [
        f"# Soak, {report['date']}",
        "",
        f"{report['machine']}; `{report['command']}`; {report['wall_s'] / 60:.1f} min.",
        f"{report['scripted']} turns ({spoken} spoken, {len(report['turns']) - spoken} typed), warm-up {a['warm_up']}"
        + (f", stopped early ({report['stopped_early']}) of {a['turns']}" if report["stopped_early"] else "")
        + f"; barge-ins: {report['barge_ins']['landed']} landed of {report['barge_ins']['scheduled']} scheduled "
        f"({report['barge_ins']['events']} BargeIn events).",
        "",
        "| invariant | ok | detail |",
        "|---|---|---|",
        *(f"| {c['name']} | {'yes' if c['ok'] else 'NO'} | {c['detail']} |" for c in report["invariants"]),
        "",
        "| process | before open | after warm-up | last turn | after close |",
        "|---|---|---|---|---|",
    ]
    s = report["samples"]
    first, last = (s[0], s[-1]) if s else ({}, {})
    for key, label in (("rss_mb", "RSS MB"), ("threads", "threads (tasks)"), ("python_threads", "Python threads"),
                       ("fds", "open fds")):
        cells = [report["before_open"][key], first.get(key, "-"), last.get(key, "-"), report["after_close"][key]]
        lines.append(f"| {label} | " + " | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    if len(s) >= 2:
        slope = np.polyfit([x["turn"] for x in s], [x["rss_mb"] for x in s], 1)[0]
        step = max(1, len(s) // 20)
        curve = ", ".join(f"{x['turn'] + 1}: {x['rss_mb']:.1f}"
                          for x in s[::step] + ([s[-1]] if (len(s) - 1) % step else []))
        lines += ["", f"RSS curve (after turn: MB), fitted slope {slope * 100:+.2f} MB per 100 turns: {curve}"]
    lines += ["", "| figure (after the warm-up) | p50 | p95 | turns |", "|---|---|---|---|"]
    for name, label in ROWS:
        f = report["figures"].get(name)
        lines.append(f"| {label} | {figure(f['p50'])} | {figure(f['p95'])} | {f['count']} |" if f
                     else f"| {label} | - | - | 0 |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
