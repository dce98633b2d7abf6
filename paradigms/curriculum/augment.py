"""Per-epoch image augmentation: random shifts and horizontal flips, a pure function of (seed, epoch, example).

Example ``i`` of epoch ``e`` is shifted by ``(dy, dx)`` pixels (each uniform in ``[-shift, shift]``,
zero-filled) and mirrored left-right with probability 1/2. The draws for all ``n`` examples come from
one generator seeded with ``(seed, epoch)``, so augmenting any subset of rows gives exactly the rows
that augmenting the whole set gives: a maker augmenting only its part, a trainer augmenting all
examples and a shared loader augmenting once for both see the same images.
"""

from __future__ import annotations

import numpy as np

from carls_dask.errors import ConfigError

__all__ = ["SHIFT", "augment_images", "augmentation_draws", "epoch_of"]

#: Largest shift, in pixels, of the augmentation.
SHIFT = 2


def epoch_of(step: int, batch_size: int, n: int) -> int:
    """The pass over the ``n`` training examples that trainer step ``step`` falls in (``step * batch_size // n``)."""
    return int(step) * int(batch_size) // max(int(n), 1)


def augmentation_draws(n: int, seed: int, epoch: int, shift: int = SHIFT) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dy, dx, flip)`` of every example of epoch ``epoch``: ``int64[n]`` shifts and ``bool[n]`` flips."""
    if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
        raise ConfigError(f"augmentation_draws: epoch={epoch!r}; expected an int >= 0")
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), 0xA06])
    dy = rng.integers(-shift, shift + 1, size=n)
    dx = rng.integers(-shift, shift + 1, size=n)
    flip = rng.random(n) < 0.5
    return dy, dx, flip


def augment_images(x: np.ndarray, *, seed: int, epoch: int, rows: np.ndarray | slice | None = None,
                   n: int | None = None, shift: int = SHIFT, out: np.ndarray | None = None) -> np.ndarray:
    """Augmented copies of images ``x`` (``[m, c, h, w]``), which are rows ``rows`` of an ``n``-example set.

    Parameters
    ----------
    x
        The images to augment (rows ``rows`` of the training set).
    seed, epoch
        Which augmentation: the same pair gives the same images.
    rows
        Indices (or a slice) of ``x``'s rows in the training set; ``None``: ``x`` is the whole set.
    n
        Examples in the whole training set (needed with ``rows``).
    shift
        Largest shift in pixels.
    out
        Where to write (``x``'s shape and dtype); a new array when ``None``.

    Raises
    ------
    ConfigError
        If ``x`` is not 4-d, ``out`` does not match it, or ``rows`` is given without ``n``.
    """
    if x.ndim != 4:
        raise ConfigError(f"augment_images: images of shape {list(x.shape)}; expected [n, channels, height, width]")
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype:
        raise ConfigError(f"augment_images: out is {out.dtype}{list(out.shape)}; expected {x.dtype}{list(x.shape)}")
    if rows is None:
        n = x.shape[0]
    elif n is None:
        raise ConfigError("augment_images: rows given without n, the size of the whole training set")
    dy, dx, flip = augmentation_draws(int(n), seed, epoch, shift)
    if rows is not None:
        dy, dx, flip = dy[rows], dx[rows], flip[rows]
    if dy.shape[0] != x.shape[0]:
        raise ConfigError(f"augment_images: {x.shape[0]} images but {dy.shape[0]} rows")
    h, w = x.shape[2], x.shape[3]
    s = shift
    out[...] = 0  # what a shift uncovers
    code = (dy + s) * (2 * s + 1) + (dx + s)
    for c in np.unique(code):
        i = np.flatnonzero(code == c)
        a, b = divmod(int(c), 2 * s + 1)
        oy, ox = s - a, s - b  # output pixel (r, q) shows input pixel (r - oy, q - ox)
        out[i, :, max(oy, 0):h + min(oy, 0), max(ox, 0):w + min(ox, 0)] = \
            x[i, :, max(-oy, 0):h + min(-oy, 0), max(-ox, 0):w + min(-ox, 0)]
    f = np.flatnonzero(flip)
    out[f] = out[f, :, :, ::-1]
    return out
