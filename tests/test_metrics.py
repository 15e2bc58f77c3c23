"""The metric figures and their recorder: known numbers in, known percentiles and events out."""

import math
import threading

import pytest

from engine.metrics import FIGURES, HINTS, LABELS, MetricsRecorder, TurnMetrics, format_figure, percentile


def test_percentiles_interpolate_between_ranks_like_numpy():
    """p50 and p95 of 1..100 interpolate linearly between ranks (50.5 and 95.05)."""
    values = list(range(100, 0, -1))
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_summary_reports_p50_and_p95_of_each_figure_measured():
    """Each figure's summary is over the turns that measured it; unmeasured figures are absent."""
    recorder = MetricsRecorder()
    for i, ttfc in enumerate([100.0, 200.0, 300.0, 400.0, 500.0]):
        recorder.record(TurnMetrics(turn=i, tts_ttfc_ms=ttfc, llm_ttft_ms=10.0 * (i + 1),
                                    stt_ms=None if i % 2 else 50.0, underruns=i))
    summary = recorder.summary()
    assert summary["tts_ttfc_ms"].count == 5
    assert summary["tts_ttfc_ms"].p50 == 300.0 and summary["tts_ttfc_ms"].p95 == pytest.approx(480.0)
    assert summary["stt_ms"].count == 3 and summary["stt_ms"].p50 == 50.0
    assert summary["underruns"].p50 == 2.0
    assert "voice_to_voice_ms" not in summary and "tts_rtf" not in summary
    assert recorder.turns == 5


def test_the_window_keeps_only_the_latest_turns():
    """With window=3, the oldest figures drop out of the percentiles."""
    recorder = MetricsRecorder(window=3)
    for ms in (1000.0, 1.0, 2.0, 3.0):
        recorder.record(TurnMetrics(llm_ttft_ms=ms))
    figure = recorder.summary()["llm_ttft_ms"]
    assert figure.count == 3 and figure.p50 == 2.0 and figure.p95 == pytest.approx(2.9)


def test_non_finite_figures_are_delivered_but_kept_out_of_the_windows():
    """An infinite RTF (no audio made) reaches subscribers but not the percentiles."""
    recorder = MetricsRecorder()
    seen = []
    recorder.subscribe(seen.append)
    recorder.record(TurnMetrics(tts_rtf=math.inf))
    assert seen[0].tts_rtf == math.inf and "tts_rtf" not in recorder.summary()


def test_subscribers_get_each_turn_in_order_until_they_unsubscribe():
    """Every subscriber gets every recorded turn; after unsubscribing, no more; a failing one harms no other."""
    recorder = MetricsRecorder()
    first, second = [], []

    def broken(metrics):
        raise RuntimeError("subscriber bug")

    recorder.subscribe(broken)
    stop_first = recorder.subscribe(first.append)
    recorder.subscribe(second.append)
    recorder.record(TurnMetrics(turn=0))
    stop_first()
    recorder.record(TurnMetrics(turn=1))
    assert [m.turn for m in first] == [0]
    assert [m.turn for m in second] == [0, 1]


def test_records_from_many_threads_are_all_counted():
    """record() from several threads at once loses no turn."""
    recorder = MetricsRecorder(window=1000)
    got = []
    recorder.subscribe(got.append)

    def work(base):
        for i in range(100):
            recorder.record(TurnMetrics(turn=base + i, tts_ttfc_ms=float(i)))

    threads = [threading.Thread(target=work, args=(k * 100,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert recorder.turns == 400 and len(got) == 400
    assert recorder.summary()["tts_ttfc_ms"].count == 400


def test_as_dict_holds_the_measured_figures_by_name():
    """as_dict() names only measured figures, as floats, for the history's metrics column."""
    metrics = TurnMetrics(turn=3, llm_ttft_ms=12.5, underruns=2, interrupted=True)
    assert metrics.as_dict() == {"llm_ttft_ms": 12.5, "underruns": 2.0}
    assert set(FIGURES) == {"end_of_turn_ms", "stt_ms", "llm_ttft_ms", "llm_first_clause_ms", "tts_ttfc_ms", "tts_rtf",
                            "voice_to_voice_ms", "underruns"}
    assert set(LABELS) == set(HINTS) == set(FIGURES)  # every figure has its name and its sentence for the user


def test_each_figure_reads_as_a_person_writes_it_and_one_not_measured_as_a_dash():
    """Milliseconds whole with their unit (never 1.41e+03), RTF to two places, underruns as a count; None or a
    non-finite figure reads as '–', never as 0 or 'nan'. Every figure has a label."""
    assert format_figure("stt_ms", None) == format_figure("tts_rtf", math.inf) == "–"
    assert format_figure("voice_to_voice_ms", 1410.4) == "1410 ms" and format_figure("tts_rtf", 0.2071) == "0.21"
    assert format_figure("underruns", 3.0) == "3"
    assert set(LABELS) == set(FIGURES)
