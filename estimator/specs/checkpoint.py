"""A model name that is a path on disk: which reader it needs.

- ``*.gguf`` (any part of a split file), or a folder holding the GGUF file(s) of one model:
  :func:`estimator.specs.gguf_file.read_gguf`;
- a folder with ``config.json`` and ``*.safetensors``:
  :func:`estimator.specs.safetensors_file.read_safetensors_folder`;
- a ``config.json``, or a folder holding one and no weights: shapes only
  (:func:`estimator.specs.config_json.load_config_json`).

The first two give a :class:`~estimator.specs.stored.StoredModelSpec` with the exact bytes stored.
"""

from __future__ import annotations

from pathlib import Path

from estimator.errors import ConfigurationError
from estimator.specs.config_json import load_config_json
from estimator.specs.gguf_file import read_gguf, split_parts
from estimator.specs.model import ModelSpec
from estimator.specs.safetensors_file import read_safetensors_folder
from estimator.specs.stored import ParamCounter


def _folder(name: str) -> Path | None:
    """``name`` as an existing folder; None for anything else, including names no file system takes."""
    try:
        path = Path(name)
        return path if path.is_dir() else None
    except (OSError, ValueError):
        return None


def _gguf_in(folder: Path) -> Path | None:
    """The one GGUF model in a folder (a vision projector mmproj-*.gguf beside it is not a model)."""
    files = sorted(p for p in folder.glob("*.gguf") if not p.name.lower().startswith("mmproj"))
    if not files:
        return None
    firsts = sorted({split_parts(p)[0].name for p in files})
    if len(firsts) > 1:
        raise ConfigurationError(f"{folder} holds the GGUF files of {len(firsts)} models "
                                 f"({', '.join(firsts[:4])}); give the path of one")
    return folder / firsts[0]


def read_local_model(name: str, counter: ParamCounter) -> ModelSpec | None:
    """The model at path ``name`` (module docstring), or None when ``name`` is not a local model.

    ``counter`` is :func:`estimator.physics.params.count_params` (see :mod:`estimator.specs.stored`).
    """
    if name.lower().endswith(".gguf"):
        return read_gguf(name, counter)
    folder = _folder(name)
    if folder is not None and (folder / "config.json").is_file():
        if any(folder.glob("*.safetensors")):
            return read_safetensors_folder(folder, counter)
        return load_config_json(folder)
    if name.endswith(".json"):
        return load_config_json(name)
    gguf = _gguf_in(folder) if folder is not None else None
    return None if gguf is None else read_gguf(gguf, counter)
