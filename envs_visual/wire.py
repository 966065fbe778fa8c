"""What the env service (envs_visual.service) and its client (envs_visual.remote) send each other: JSON,
with every value packed so that it comes back equal, not merely similar.

  uint8 image (H, W, 3) or (H, W)  -> {"__png__": base64 PNG}            (lossless)
  other numpy array                -> {"__array__": nested list, "dtype": name}
  numpy scalar                     -> its Python value
  tuple                            -> {"__tuple__": [...]}               (facts are tuples)
  dict, list, str, int, float, bool, None as they are (dict keys must be strings)

A Python float survives JSON exactly (repr round-trips), float32 array entries too (float32 -> float64 is
exact), so an episode played through the service equals one played in process.

The env's attributes that the trainer reads (docs/env-service.md): STATIC_ATTRIBUTES once per session, and
after every reset and step the state-dependent STATE_ATTRIBUTES and the results of STATE_METHODS.
"""

import base64
import io
from typing import Any

import numpy as np
from PIL import Image

STATIC_ATTRIBUTES = (
    "action_names",
    "instruction",
    "image_legend",
    "text_legend",
    "example_facts",
    "supports_random_start",
    "max_steps",
)
STATE_ATTRIBUTES = ("layout_key",)
STATE_METHODS = ("describe_state", "state_features")
PNG_COMPRESS_LEVEL = 1  # the fastest zlib level: images are small, the link is fast (bench/env_service_bench)


def encode_png(image: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_png(data: str) -> np.ndarray:
    with Image.open(io.BytesIO(base64.b64decode(data))) as image:
        return np.asarray(image)


def _is_image(value: np.ndarray) -> bool:
    return value.dtype == np.uint8 and (value.ndim == 2 or (value.ndim == 3 and value.shape[2] in (3, 4)))


def pack(value: Any) -> Any:
    """`value` as JSON-ready data (module docstring); TypeError on anything else."""
    if isinstance(value, np.ndarray):
        if _is_image(value):
            return {"__png__": encode_png(value)}
        return {"__array__": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {"__tuple__": [pack(v) for v in value]}
    if isinstance(value, list):
        return [pack(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("only dicts with string keys can be sent")
        return {k: pack(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot send a {type(value).__name__}")


def unpack(value: Any) -> Any:
    """The inverse of `pack`."""
    if isinstance(value, list):
        return [unpack(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__png__" in value:
        return decode_png(value["__png__"])
    if "__array__" in value:
        return np.array(value["__array__"], dtype=np.dtype(value["dtype"]))
    if "__tuple__" in value:
        return tuple(unpack(v) for v in value["__tuple__"])
    return {k: unpack(v) for k, v in value.items()}


def static_attributes(game: Any) -> dict[str, Any]:
    """The packed STATIC_ATTRIBUTES the env has, and under "state_methods" the STATE_METHODS it has."""
    attributes = {name: pack(getattr(game, name)) for name in STATIC_ATTRIBUTES if hasattr(game, name)}
    return attributes | {"state_methods": [name for name in STATE_METHODS if hasattr(game, name)]}


def state_of(game: Any) -> dict[str, Any]:
    """The packed state-dependent attributes and method results the env has, read now."""
    state = {name: pack(getattr(game, name)) for name in STATE_ATTRIBUTES if hasattr(game, name)}
    state |= {name: pack(getattr(game, name)()) for name in STATE_METHODS if hasattr(game, name)}
    return state
