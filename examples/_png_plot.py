"""A line plot written as a PNG with the standard library only (zlib, struct): for the
examples on machines without matplotlib. Axes frame and lines, no text."""

import struct
import zlib


def line_plot(path, series, width=720, height=420, margin=30):
    """``series``: [(values, (r, g, b)), ...] drawn in order on a log-y scale, 2 px lines."""
    import math
    pixels = [bytearray(b"\xff\xff\xff" * width) for _ in range(height)]

    def put(x, y, rgb):
        for dx in (0, 1):
            for dy in (0, 1):
                if 0 <= x + dx < width and 0 <= y + dy < height:
                    pixels[y + dy][3 * (x + dx):3 * (x + dx) + 3] = bytes(rgb)

    logs = [math.log10(v) for values, _ in series for v in values if v > 0]
    lo, hi = min(logs), max(logs)
    n = max(len(values) for values, _ in series)
    plot_w, plot_h = width - 2 * margin, height - 2 * margin

    def to_px(i, v):
        y = (math.log10(v) - lo) / ((hi - lo) or 1.0)
        return margin + round(i * plot_w / max(n - 1, 1)), margin + round((1 - y) * plot_h)

    for x in range(margin, width - margin + 1):
        put(x, margin, (0, 0, 0))
        put(x, height - margin, (0, 0, 0))
    for y in range(margin, height - margin + 1):
        put(margin, y, (0, 0, 0))
        put(width - margin, y, (0, 0, 0))
    for values, rgb in series:
        points = [to_px(i, v) for i, v in enumerate(values) if v > 0]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            steps = max(abs(x1 - x0), abs(y1 - y0), 1)
            for s in range(steps + 1):
                put(x0 + (x1 - x0) * s // steps, y0 + (y1 - y0) * s // steps, rgb)

    raw = b"".join(b"\x00" + bytes(row) for row in pixels)

    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    with open(path, "wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n")
        fh.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)))
        fh.write(chunk(b"IDAT", zlib.compress(raw, 9)))
        fh.write(chunk(b"IEND", b""))
