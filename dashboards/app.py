"""Served dashboard of runs: ``panel serve dashboards/app.py --args [--table NAME] RUN [RUN ...]`` (or ``CARLS_RUN=RUN``).

Every argument is a run folder (or a folder of runs); ``--table NAME`` (or ``CARLS_TABLE``) names the bank
table the views show first. Bind it to localhost, as ``carls-dask dashboard RUN`` does::

    panel serve dashboards/app.py --address 127.0.0.1 --port 5006 \\
        --allow-websocket-origin=127.0.0.1:5006 --args runs/cora runs/cora-base
"""

from __future__ import annotations

import sys
import threading

import panel as pn

from carls_dask import config
from carls_dask.dashboards import plots
from carls_dask.dashboards.dashboard import Dashboard, run_paths_from, table_from

pn.extension(sizing_mode="stretch_width", notifications=False, inline=True)  # no CDN: works offline


def _serve_stylesheets_locally() -> None:
    """Make Panel's fallback for component stylesheets this server's copy, never its CDN.

    Panel points a component's stylesheets (``loading.css``, ``alerts.css``, ...) at the page's
    ``dist_url``, and at its CDN when the document it builds for has none (a model built outside a
    served page's document). Such a model would make an offline page fetch from outside; with this
    fallback it asks the server it came from, which serves the same files.
    """
    from panel import reactive
    from panel.io.resources import LOCAL_DIST

    reactive.CDN_DIST = LOCAL_DIST


_serve_stylesheets_locally()

if not pn.state.cache.get("carls-warm"):
    # Import datashader here, not in the thread below: its optional imports (dask.dataframe) may fail
    # and leave sys.modules while Panel walks it after running this script, which then fails the page.
    import datashader
    import datashader.transfer_functions  # noqa: F401

    # Compile the projection's aggregation once per server process, off the event loop.
    pn.state.cache["carls-warm"] = threading.Thread(target=plots.warm_up, name="datashader-warm-up", daemon=True)
    pn.state.cache["carls-warm"].start()


def build() -> pn.viewable.Viewable | pn.viewable.Viewer:
    """Build the page for the runs named on the command line or in ``CARLS_RUN`` (folders of runs expanded)."""
    paths = run_paths_from(sys.argv)
    if not paths:
        return pn.pane.Alert(
            "No run given. Run `carls-dask dashboard RUN [RUN ...]`, or set CARLS_RUN.",
            alert_type="warning",
        )
    dash = Dashboard(
        paths,
        table=table_from(sys.argv),
        period=config.get_seconds("dashboard.refresh"),
        plot_period=config.get_seconds("dashboard.plot-refresh"),
    )
    # The page goes out at once with empty figures; reading starts when the browser has loaded it, in
    # worker threads, and each refresh updates the figures in place.

    def start() -> None:
        dash.start()

    pn.state.onload(start)
    return dash


if __name__.startswith("bokeh_app") or __name__ == "__main__":
    # A plain layout, not a template: templates fetch web fonts, and the page must work offline.
    pn.Column("# carls-dask run", build(), sizing_mode="stretch_width").servable(title="carls-dask run")
