"""The dashboard's views: each is a :class:`panel.viewable.Viewer` over a :class:`~dashboards.runreader.RunReader`.

Use them inline in a notebook::

    import panel as pn
    from dashboards.runreader import RunReader
    from dashboards.views import DriftView

    pn.extension()
    view = DriftView(reader=RunReader("runs/cora"))
    view            # shows the view; call view.refresh() to pick up new data
"""

from __future__ import annotations

from dashboards.views.curriculum import CurriculumView
from dashboards.views.drift import DriftView
from dashboards.views.health import HealthView
from dashboards.views.pseudolabels import PseudoLabelView

__all__ = ["CurriculumView", "DriftView", "HealthView", "PseudoLabelView"]
