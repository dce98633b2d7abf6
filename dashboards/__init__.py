"""dashboards package of carls-dask."""
