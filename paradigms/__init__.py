"""paradigms package of carls-dask."""
