"""Renders assets/icon.svg into the raster icons that are committed beside it: icon.png (256 px, the
window icon where SVG support is missing) and icon.ico (16-256 px, PyInstaller's Windows icon).

Run after editing the SVG: QT_QPA_PLATFORM=offscreen .venv/bin/python assets/render_icons.py
"""

from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ASSETS = Path(__file__).resolve().parent
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)


def render(renderer: QSvgRenderer, size: int) -> QImage:
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def png_bytes(image: QImage) -> bytes:
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(data)


def ico_bytes(images: list[QImage]) -> bytes:
    """An ICO file of PNG entries (valid since Windows Vista): header, directory, then the PNGs."""
    pngs = [png_bytes(image) for image in images]
    out = bytearray((0).to_bytes(2, "little") + (1).to_bytes(2, "little") + len(pngs).to_bytes(2, "little"))
    offset = 6 + 16 * len(pngs)
    for image, png in zip(images, pngs):
        side = image.width() % 256  # 0 means 256 in an ICO directory entry
        out += bytes((side, side, 0, 0)) + (1).to_bytes(2, "little") + (32).to_bytes(2, "little")
        out += len(png).to_bytes(4, "little") + offset.to_bytes(4, "little")
        offset += len(png)
    for png in pngs:
        out += png
    return bytes(out)


def main():
    app = QGuiApplication([])  # noqa: F841 (QPainter needs an application)
    renderer = QSvgRenderer(str(ASSETS / "icon.svg"))
    if not renderer.isValid():
        raise SystemExit(f"{ASSETS / 'icon.svg'}: not a valid SVG")
    (ASSETS / "icon.png").write_bytes(png_bytes(render(renderer, 256)))
    (ASSETS / "icon.ico").write_bytes(ico_bytes([render(renderer, s) for s in ICO_SIZES]))
    print(f"wrote {ASSETS / 'icon.png'} and {ASSETS / 'icon.ico'}")


if __name__ == "__main__":
    main()
