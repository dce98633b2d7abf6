"""Live figures: updates queue off the page and land in the same Bokeh models, streaming lines that grew."""

from __future__ import annotations

import numpy as np
from bokeh.document import Document

from carls_dask.dashboards.figures import LiveBars, LiveCurves, LiveHeatmap, LiveImage, LiveStackedBars


def _events(doc: Document) -> list[object]:
    out: list[object] = []
    doc.on_change(out.append)
    return out


def test_curves_stream_only_the_new_points_of_a_line_that_grew() -> None:
    fig = LiveCurves("loss", name="loss")
    doc = Document()
    doc.add_root(fig.figure)
    x = np.arange(10.0)
    fig.set([("train", x, x**2)])
    assert fig.note.visible and not fig.sources  # queued, not applied
    assert fig.flush() and not fig.note.visible
    src = fig.sources["train"]
    assert src.name == "loss/train"

    events = _events(doc)
    x2 = np.arange(13.0)
    fig.set([("train", x2, x2**2)])
    fig.flush()
    assert fig.sources["train"] is src and fig.streamed_points == 3
    assert [type(e).__name__ for e in events] == ["ColumnsStreamedEvent"]
    np.testing.assert_array_equal(src.data["y"], x2**2)

    # A changed history (not a prefix) replaces the data; the same data again changes nothing.
    fig.set([("train", x2, -x2)])
    fig.flush()
    assert fig.replaced_points == 10 + 13
    n = len(events)
    fig.set([("train", x2, -x2)])
    fig.flush()
    assert len(events) == n


def test_bars_heatmap_image_and_notes_update_in_place() -> None:
    bars = LiveBars("rows per shard", xlabel="shard", ylabel="rows")
    bars.set([0, 1], [5, 7])
    bars.flush()
    assert list(bars.x_range.factors) == ["0", "1"] and list(bars.source.data["top"]) == [5, 7]
    bars.set([0, 1, 2], [5, 7, 9], title="rows per shard (3)")
    bars.flush()
    assert list(bars.x_range.factors) == ["0", "1", "2"] and bars.figure.title.text == "rows per shard (3)"  # type: ignore[union-attr]

    stacked = LiveStackedBars("confidence")
    stacked.set([0.25, 0.75], {"right": [1, 2], "wrong": [3, 4]})
    stacked.flush()
    assert list(stacked.source.data["bottom"]) == [0, 0, 1, 2] and list(stacked.source.data["top"]) == [1, 2, 4, 6]

    heat = LiveHeatmap("difficulty")
    heat.set([10, 20], [0.1, 0.3, 0.5], np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]))
    heat.flush()
    assert len(heat.source.data["value"]) == 6 and heat.mapper.high == 5.0
    assert list(heat.source.data["w"][:3]) == [10, 10, 10]

    image = LiveImage("map", size=8)
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., 3] = 255
    image.set(rgba, (0.0, 1.0, 2.0, 5.0))
    image.flush()
    assert image.source.data["image"][0].shape == (8, 8) and image.source.data["dh"] == [4.0]

    bars.set_note("no bank yet")
    bars.flush()
    assert bars.note.visible and bars.note.text == "no bank yet" and len(bars.source.data["x"]) == 0
    assert not bars.flush()  # nothing queued
