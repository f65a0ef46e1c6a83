"""Tokenizer / processor loading and image helpers under upstream slime's `processing_utils` names.

The text paths are complete: `load_tokenizer`, and `load_processor`, which gives None for a text-only
model as upstream's does. The image helpers are plain data conversions and work here too, but this
trainer does not train on images (`GenerateState.processor` stays None), and a vision model whose
processor transformers cannot build by itself is refused rather than half-loaded.

`transformers` and PIL are imported inside the functions: importing this module stays cheap, and it
works when upstream's contract tests replace `transformers` with a stand-in holding only
AutoTokenizer, AutoProcessor, PreTrainedTokenizerBase and ProcessorMixin.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Vision patch edge in pixels when the processor does not say (Qwen2.5-VL: 14; Qwen3-VL uses 16).
DEFAULT_PATCH_SIZE = 14

_MODALITY_KWARGS = ("audio_kwargs", "images_kwargs", "videos_kwargs")
# Files only a multimodal model folder has (transformers 5 writes processor_config.json alone).
_PROCESSOR_CONFIGS = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)` (e.g. `trust_remote_code=True`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def load_processor(name_or_path: str, **kwargs: Any) -> Any | None:
    """The model's multimodal processor, or None for a text-only model.

    None when transformers finds no processor (OSError / ValueError) or finds only a tokenizer. A
    local folder with a processor config whose processor transformers cannot build (GLM-4.5V / 4.6V
    on older transformers, which upstream assembles by hand) raises NotImplementedError.
    """
    from transformers import AutoProcessor, PreTrainedTokenizerBase, ProcessorMixin

    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError) as exc:
        logger.info("no multimodal processor for %s (%s: %s); treating it as text-only",
                    name_or_path, type(exc).__name__, exc)
        processor = None
    if isinstance(processor, PreTrainedTokenizerBase) or not isinstance(processor, ProcessorMixin):
        processor = None
    if processor is None and (config := _multimodal_config(name_or_path)):
        raise NotImplementedError(
            f"{name_or_path} has {config} (a multimodal model) but transformers' AutoProcessor could "
            "not build its processor; this trainer does not assemble multimodal "
            "processors by hand: use a transformers version that registers this model's processor, "
            "or a text-only checkpoint"
        )
    return processor


def _multimodal_config(name_or_path: str) -> str | None:
    """The name of a processor config file in a local model folder, None if it has none (text-only)."""
    for name in _PROCESSOR_CONFIGS:
        try:
            if (Path(name_or_path) / name).is_file():
                return name
        except (OSError, TypeError, ValueError):
            return None
    return None


def build_processor_kwargs(multimodal_inputs: dict | None = None) -> dict:
    """Keyword arguments for `processor(text=..., **kwargs)` in a rollout.

    The caller's `multimodal_inputs` (images, videos, per-modality kwargs) are kept; text comes back as
    plain lists (`return_tensors=None`, no mm token type ids) because token ids go to the engine as
    JSON, while each modality's kwargs ask for torch tensors (`return_tensors="pt"`) for training.
    """
    kwargs = dict(multimodal_inputs or {})
    kwargs["text_kwargs"] = {**kwargs.get("text_kwargs", {}), "return_tensors": None,
                             "return_mm_token_type_ids": False}
    for name in _MODALITY_KWARGS:
        kwargs[name] = {**kwargs.get(name, {}), "return_tensors": "pt"}
    return kwargs


def encode_image_for_rollout_engine(image: Any) -> str:
    """A PIL image as the `data:image/png;base64,...` URI SGLang's `image_data` takes (RGB, PNG)."""
    if not hasattr(image, "save") or not hasattr(image, "mode"):
        raise TypeError(f"expected a PIL image, got {type(image).__name__}; open files with PIL.Image.open first")
    if image.mode != "RGB":
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def process_vision_info(prompt: Any, processor: Any) -> dict[str, Any]:
    """`{"images": [...] or None, "videos": [...] or None}` taken from a chat prompt's image parts.

    With `qwen_vl_utils` installed its own extraction is used (it resizes to the processor's patch
    grid); otherwise, or if it fails on a non-Qwen prompt, every `{"type": "image", "image": ...}` part
    is opened as given: a PIL image, a data URI, base64 text or a file path. Videos need
    `qwen_vl_utils`.
    """
    try:
        from qwen_vl_utils import process_vision_info as qwen_vision_info
    except ImportError:
        qwen_vision_info = None
    if qwen_vision_info is not None:
        patch = getattr(getattr(processor, "image_processor", None), "patch_size", None) or DEFAULT_PATCH_SIZE
        try:
            images, videos = qwen_vision_info(prompt, image_patch_size=patch)
            return {"images": images, "videos": videos}
        except Exception as exc:  # other model families' prompts: fall back to opening the parts as given
            logger.warning("qwen_vl_utils could not read the prompt (%s: %s); opening its images directly",
                           type(exc).__name__, exc)
    return {"images": _images_in_messages(prompt) or None, "videos": None}


def _images_in_messages(messages: Any) -> list[Any]:
    """The images of every `{"type": "image", "image": ...}` content part, in message order."""
    if not isinstance(messages, list):
        return []
    found = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image" and part.get("image") is not None:
                found.append(_open_image(part["image"]))
    return found


def _open_image(data: Any) -> Any:
    from PIL import Image

    if isinstance(data, Image.Image):
        return data
    if isinstance(data, os.PathLike):
        return Image.open(data)
    if not isinstance(data, str):
        raise TypeError(f"an image part must be a PIL image, a data URI, base64 text or a path, not "
                        f"{type(data).__name__}")
    if data.startswith("data:"):
        return Image.open(io.BytesIO(base64.b64decode(data.partition(",")[2])))
    if os.path.isfile(data):
        return Image.open(data)
    try:
        return Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
    except (binascii.Error, ValueError, OSError) as exc:
        shown = data if len(data) <= 80 else data[:77] + "..."
        raise ValueError(f"image part {shown!r} is neither an existing file nor base64 image data") from exc
