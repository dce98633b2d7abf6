"""The dashboard's views: each is a :class:`panel.viewable.Viewer` over a :class:`~carls_dask.dashboards.runreader.RunReader`.

Use them inline in a notebook::

    import panel as pn
    from carls_dask.dashboards.runreader import RunReader
    from carls_dask.dashboards.views import DriftView

    pn.extension()
    view = DriftView(reader=RunReader("runs/cora"))
    view            # shows the view; call view.refresh() to pick up new data

:class:`CompareView` takes several readers (``readers=[...]``) and overlays their curves.
"""

from __future__ import annotations

from carls_dask.dashboards.views.compare import CompareView
from carls_dask.dashboards.views.curriculum import CurriculumView
from carls_dask.dashboards.views.drift import DriftView
from carls_dask.dashboards.views.health import HealthView
from carls_dask.dashboards.views.learning import LearningView
from carls_dask.dashboards.views.pseudolabels import PseudoLabelView

__all__ = ["CompareView", "CurriculumView", "DriftView", "HealthView", "LearningView", "PseudoLabelView"]
