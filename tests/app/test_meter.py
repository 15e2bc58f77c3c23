"""The latency meter shows what engine/metrics delivers: the last turn, p50/p95, a chart, the input level."""

import math

import pytest
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QLabel

from app.meter import CHART_TURNS, LatencyMeter, RollingChart
from engine.metrics import HINTS, LABELS, MetricsRecorder, TurnMetrics, format_figure


def test_the_meter_updates_from_metric_events_with_the_recorders_percentiles(qtbot):
    """Each recorded turn reaches the meter through the recorder's subscription; its cells are the summary's."""
    meter = LatencyMeter()
    qtbot.addWidget(meter)
    recorder = MetricsRecorder()
    recorder.subscribe(lambda m: meter.show_turn(m, recorder.summary()))
    turns = [
        TurnMetrics(turn=0, end_of_turn_ms=320.0, stt_ms=210.0, llm_ttft_ms=95.0, tts_ttfc_ms=120.0, tts_rtf=0.41,
                    voice_to_voice_ms=640.0),
        TurnMetrics(turn=1, llm_ttft_ms=80.0, tts_ttfc_ms=150.0, tts_rtf=0.52),  # typed: no STT, no voice-to-voice
        TurnMetrics(turn=2, end_of_turn_ms=610.0, stt_ms=190.0, llm_ttft_ms=101.0, tts_ttfc_ms=133.0, tts_rtf=0.47,
                    voice_to_voice_ms=580.0, interrupted=True),
    ]
    for m in turns:
        recorder.record(m)

    summary = recorder.summary()
    for name in ("tts_ttfc_ms", "tts_rtf", "end_of_turn_ms", "stt_ms", "llm_ttft_ms", "voice_to_voice_ms"):
        last, p50, p95 = (cell.text() for cell in meter.values[name])
        assert last == format_figure(name, getattr(turns[-1], name))
        assert (p50, p95) == (format_figure(name, summary[name].p50), format_figure(name, summary[name].p95))
    assert meter.values["tts_ttfc_ms"][0].text() == "133 ms" and meter.values["tts_rtf"][0].text() == "0.47"
    assert "turn 3, interrupted" in meter.turns.text()
    assert list(meter.chart.series["tts_ttfc_ms"]) == [120.0, 150.0, 133.0]
    v2v = list(meter.chart.series["voice_to_voice_ms"])
    assert v2v[0] == 640.0 and math.isnan(v2v[1]) and v2v[2] == 580.0  # the typed turn is a gap


def test_each_figure_shows_as_soon_as_it_is_measured_and_a_new_turn_starts_afresh(qtbot):
    """Measured figures fill the "last" column while the turn runs; the next turn's first figure clears the rest,
    and the turn's end brings the percentiles."""
    meter = LatencyMeter()
    qtbot.addWidget(meter)
    meter.show_turn(TurnMetrics(turn=0, stt_ms=300.0, tts_ttfc_ms=40.0, voice_to_voice_ms=900.0),
                    MetricsRecorder().summary())
    meter.show_figure(1, "stt_ms", 250.0)
    assert meter.values["stt_ms"][0].text() == "250 ms"
    assert meter.values["tts_ttfc_ms"][0].text() == meter.values["voice_to_voice_ms"][0].text() == "–"
    assert "turn 2 under way" in meter.turns.text()
    meter.show_figure(1, "llm_first_clause_ms", 300.0)  # measured, not shown: nothing changes
    meter.show_figure(1, "tts_ttfc_ms", 31.6)
    assert (meter.values["stt_ms"][0].text(), meter.values["tts_ttfc_ms"][0].text()) == ("250 ms", "32 ms")
    recorder = MetricsRecorder()
    recorder.record(TurnMetrics(turn=1, stt_ms=250.0, tts_ttfc_ms=31.6, voice_to_voice_ms=700.0))
    meter.show_turn(TurnMetrics(turn=1, stt_ms=250.0, tts_ttfc_ms=31.6, voice_to_voice_ms=700.0), recorder.summary())
    assert meter.values["voice_to_voice_ms"][0].text() == "700 ms" and "turn 2;" in meter.turns.text()
    meter.show_figure(1, "stt_ms", 1.0)  # a late figure of the same turn does not clear the column
    assert meter.values["voice_to_voice_ms"][0].text() == "700 ms"


def test_each_figure_says_what_it_measures_and_each_cell_which_figure_it_is(qtbot):
    """Hovering a figure's name or number tells what it measures; a screen reader, which reads one cell at a time,
    hears the figure and the column with the number."""
    meter = LatencyMeter()
    qtbot.addWidget(meter)
    names = {label.text(): label for label in meter.findChildren(QLabel)}
    for name, cells in meter.values.items():
        assert names[LABELS[name]].toolTip() == HINTS[name] and HINTS[name]
        assert [cell.accessibleName() for cell in cells] == [f"{LABELS[name]}, {column}" for column in
                                                            ("last turn", "median", "95th percentile")]
        assert all(cell.toolTip() == cell.accessibleDescription() == HINTS[name] for cell in cells)
    assert "0 when" in HINTS["stt_ms"]  # a figure of 0 is explained where it is shown


def test_the_level_bar_follows_the_input_level(qtbot):
    """Level events fill the bar: silence empty, -30 dBFS half, 0 dBFS full; the widget repaints."""
    meter = LatencyMeter()
    qtbot.addWidget(meter)
    meter.show()
    assert meter.level.fraction() == 0.0
    meter.set_level(-30.0)
    assert meter.level.fraction() == 0.5
    meter.set_level(3.0)
    assert meter.level.fraction() == 1.0
    meter.set_level(-math.inf)
    assert meter.level.fraction() == 0.0
    meter.chart.add_turn({"tts_ttfc_ms": 100.0})
    assert not meter.chart.grab().isNull()  # the painters run on real data without error


def test_the_chart_spreads_the_turns_so_far_across_its_width_then_rolls(qtbot):
    """A few turns span the chart, oldest at the left, on the scale of the largest figure; a gap stays a gap; past
    CHART_TURNS the oldest turn leaves and the spacing stays."""
    chart = RollingChart()
    qtbot.addWidget(chart)
    area = QRectF(0, 0, 290, 110)
    chart.add_turn({"voice_to_voice_ms": 1000.0, "tts_ttfc_ms": 40.0})
    (only,) = chart.points("voice_to_voice_ms", area)
    assert only.x() == 145.0  # one turn: the middle
    chart.add_turn({"tts_ttfc_ms": 30.0})  # typed: no voice to voice
    chart.add_turn({"voice_to_voice_ms": 550.0, "tts_ttfc_ms": 20.0})
    first, gap, last = chart.points("voice_to_voice_ms", area)
    assert gap is None
    assert (first.x(), last.x()) == (0.0, 290.0)
    assert (first.y(), last.y()) == pytest.approx((10.0, 55.0))  # 1000 and 550 ms on a 1100 ms scale, 110 px high
    assert [p.x() for p in chart.points("tts_ttfc_ms", area)] == [0.0, 145.0, 290.0]
    for i in range(CHART_TURNS):
        chart.add_turn({"voice_to_voice_ms": 500.0 + i, "tts_ttfc_ms": 20.0})
    points = chart.points("voice_to_voice_ms", area)
    assert len(points) == CHART_TURNS and points[0].x() == 0.0 and points[-1].x() == 290.0
    assert points[1].x() - points[0].x() == pytest.approx(290.0 / (CHART_TURNS - 1))
    # the first turns' 1000 ms have left the chart, and the scale with them
    assert chart.scale_ms() == pytest.approx((500.0 + CHART_TURNS - 1) * 1.1)
