"""The latency meter: the last turn's figures with their p50/p95, a rolling chart, and the input level.

Every number comes from the engine (engine/metrics.py's figures: each as the turn measures it, then the turn's
TurnMetrics with the recorder's summary, relayed by the worker) or from the voice loop's Level events; nothing is
timed here.
Object names for the style sheet: QWidget#latencyMeter, QLabel#meterValue, QLabel#meterHeading,
LevelMeter#levelMeter, RollingChart#latencyChart.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from engine.metrics import HINTS, LABELS, format_figure

# engine/metrics.py's, in order
SHOWN = ("tts_ttfc_ms", "tts_rtf", "end_of_turn_ms", "stt_ms", "llm_ttft_ms", "voice_to_voice_ms")
CHARTED = ("voice_to_voice_ms", "tts_ttfc_ms")  # the chart's lines, in this order
CHART_TURNS = 30
LEVEL_FLOOR_DBFS = -60.0  # the level bar's empty end; speech sits around -30..-10 dBFS


class LevelMeter(QWidget):
    """A horizontal bar of the microphone's level (dBFS), from the voice loop's Level events."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("levelMeter")
        self.setAccessibleName("Microphone level")
        self.setAccessibleDescription("How loud the microphone hears you, from silent to full")
        self.rms_dbfs = -math.inf
        self.setMinimumHeight(10)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setToolTip("Microphone level")

    def sizeHint(self) -> QSize:
        return QSize(160, 10)

    def set_level(self, rms_dbfs: float) -> None:
        self.rms_dbfs = rms_dbfs
        self.update()

    def fraction(self) -> float:
        """How full the bar is, 0..1."""
        if not math.isfinite(self.rms_dbfs):
            return 0.0
        return min(max(1.0 - self.rms_dbfs / LEVEL_FLOOR_DBFS, 0.0), 1.0)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        box = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(self.palette().color(QPalette.ColorRole.AlternateBase))
        painter.drawRoundedRect(box, 4, 4)
        filled = QRectF(box.left(), box.top(), box.width() * self.fraction(), box.height())
        painter.setBrush(self.palette().color(QPalette.ColorRole.Highlight))
        painter.drawRoundedRect(filled, 4, 4)


class RollingChart(QWidget):
    """Lines of the last CHART_TURNS turns' figures (CHARTED), drawn with QPainter on a shared ms scale."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("latencyChart")
        self.series: dict[str, deque[float]] = {name: deque(maxlen=CHART_TURNS) for name in CHARTED}
        self.setMinimumSize(160, 60)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setToolTip("Voice to voice (solid) and TTFC (dashed), last turns")

    def add_turn(self, figures: Mapping[str, float]) -> None:
        """One turn's figures (TurnMetrics.as_dict()); figures it lacks leave a gap in their line."""
        for name, values in self.series.items():
            values.append(figures.get(name, math.nan))
        self.update()

    def scale_ms(self) -> float | None:
        """The figure at the chart's top edge: a little above the largest charted (1 ms where all are 0); None while
        there is none."""
        finite = [v for values in self.series.values() for v in values if math.isfinite(v)]
        return (max(finite) * 1.1 or 1.0) if finite else None

    def points(self, name: str, area: QRectF) -> list[QPointF | None]:
        """Where each of the series' turns goes in `area` (None: a gap). The turns so far span the width, oldest at
        the left, until there are CHART_TURNS of them, so that a few turns make a chart, not dots in one corner; a
        single turn sits in the middle."""
        values, top = self.series[name], self.scale_ms()  # not None where any value is finite
        step = area.width() / max(len(values) - 1, 1)
        first_x = area.left() if len(values) > 1 else area.center().x()
        return [QPointF(first_x + i * step, area.bottom() - area.height() * v / top) if math.isfinite(v) else None
                for i, v in enumerate(values)]

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        colors = self.palette()
        painter.fillRect(self.rect(), colors.color(QPalette.ColorRole.AlternateBase))
        top = self.scale_ms()
        if top is None:
            return
        area = QRectF(self.rect()).adjusted(4, 4, -4, -4)
        painter.setPen(colors.color(QPalette.ColorRole.PlaceholderText))
        painter.drawText(area, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, f"{top:.0f} ms")
        accent = QColor(colors.color(QPalette.ColorRole.Highlight))
        for name, dash in zip(CHARTED, (Qt.PenStyle.SolidLine, Qt.PenStyle.DashLine)):
            path, drawing, dots = QPainterPath(), False, []
            for point in self.points(name, area):
                if point is None:
                    drawing = False
                    continue
                path.lineTo(point) if drawing else path.moveTo(point)
                dots.append(point)
                drawing = True
            painter.setPen(QPen(accent, 2, dash))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawPath(path)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(accent)
            for point in dots:  # a turn between gaps is a dot, not an invisible line of one point
                painter.drawEllipse(point, 3, 3)


class LatencyMeter(QWidget):
    """The figures of the last turn beside their p50 and p95, the chart, and the input level.

    show_figure(turn, name, value) shows a figure of the running turn as soon as it is measured (the events'
    Measured); show_turn(metrics, summary) takes what MetricsRecorder delivers when the turn ends: its TurnMetrics and
    recorder.summary() ({figure: Figure(count, p50, p95)}).
    """

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("latencyMeter")
        # a plain QWidget paints no style-sheet background (the card) without this
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        # as wide as its longest label and figures need, never narrower: "LLM first token" is not cut
        self.setSizePolicy(QSizePolicy.Policy.Minimum, QSizePolicy.Policy.Preferred)
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        for column, heading in enumerate(("", "last", "p50", "p95")):
            label = QLabel(heading, objectName="meterHeading")
            label.setAlignment(Qt.AlignmentFlag.AlignRight if column else Qt.AlignmentFlag.AlignLeft)
            grid.addWidget(label, 0, column)
        self.values: dict[str, tuple[QLabel, QLabel, QLabel]] = {}
        for row, name in enumerate(SHOWN, start=1):
            grid.addWidget(QLabel(LABELS[name], toolTip=HINTS[name]), row, 0)
            # a screen reader reads a cell alone: its name says which figure and which column it is
            cells = tuple(QLabel("–", objectName="meterValue", toolTip=HINTS[name], accessibleDescription=HINTS[name],
                                 accessibleName=f"{LABELS[name]}, {column}")
                          for column in ("last turn", "median", "95th percentile"))
            for column, cell in enumerate(cells, start=1):
                cell.setAlignment(Qt.AlignmentFlag.AlignRight)
                grid.addWidget(cell, row, column)
            self.values[name] = cells
        self.chart = RollingChart()
        self.legend = QLabel(f"Last {CHART_TURNS} turns — solid: voice to voice, dashed: TTFC",
                             objectName="meterHeading", wordWrap=True)
        self.level = LevelMeter()
        self.turns = QLabel("no turns yet", objectName="meterHeading")
        self.running: int | None = None  # the turn whose figures the "last" column is filling in
        self.counted = 0  # how many turns the p50/p95 are over
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Latency", objectName="meterTitle"))
        layout.addLayout(grid)
        layout.addWidget(self.chart, 1)
        layout.addWidget(self.legend)
        layout.addWidget(self.turns)
        layout.addWidget(QLabel("Microphone", objectName="meterHeading"))
        layout.addWidget(self.level)

    def show_figure(self, turn: int, name: str, value: float) -> None:
        """A figure of turn `turn` (0, 1, ...), measured just now; the "last" column starts afresh with a new turn."""
        if turn != self.running:
            self.running = turn
            for last, _, _ in self.values.values():
                last.setText("–")
            self.turns.setText(f"turn {turn + 1} under way; p50/p95 over {self.counted} turns")
        if name in self.values:
            self.values[name][0].setText(format_figure(name, value))

    def show_turn(self, metrics, summary: Mapping) -> None:
        """One turn's figures (engine/metrics.py TurnMetrics) and the rolling p50/p95 over the window."""
        figures = metrics.as_dict()
        for name in SHOWN:
            last, p50, p95 = self.values[name]
            last.setText(format_figure(name, figures.get(name)))
            figure = summary.get(name)
            p50.setText(format_figure(name, figure.p50 if figure else None))
            p95.setText(format_figure(name, figure.p95 if figure else None))
        self.chart.add_turn(figures)
        self.running = metrics.turn
        self.counted = max((f.count for f in summary.values()), default=0)
        note = ", interrupted" if metrics.interrupted else ""
        self.turns.setText(f"turn {metrics.turn + 1}{note}; p50/p95 over {self.counted} turns")

    def set_level(self, rms_dbfs: float) -> None:
        self.level.set_level(rms_dbfs)
