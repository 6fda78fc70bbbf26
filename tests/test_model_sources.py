"""A model source is what its bytes are: a GGUF that does not load whole (truncated, of an architecture transformers
does not read, or missing weights its architecture has) is refused naming ``base.model_path``, and ``dvc.lock``
follows the source's content, not its name."""

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from gguf import GGML_QUANT_SIZES, GGUFWriter
from omegaconf import OmegaConf

from flows.cli import main
from models.sources import ggml_quant_sizes
from tests.conftest import ENV, REPO, make_project, stages_run, warm

_TOKENS = ["<s>", "</s>", *"abcdefghijklmnopqrstuvwxyz0123456789 +=", "ab"]


def tiny_gguf(path: Path, architecture: str = "llama", seed: int = 0, chat_template: str | None = None) -> Path:
    """A GGUF file of a one-layer Llama's weights (float32) and a BPE tokenizer, declaring ``architecture`` (and
    ``chat_template``, when given)."""
    hidden, ff = 16, 32
    writer = GGUFWriter(str(path), architecture)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // 2)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(_TOKENS)
    writer.add_token_types([1] * len(_TOKENS))
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    shapes = {"token_embd.weight": (len(_TOKENS), hidden), "output_norm.weight": (hidden,)}
    shapes |= {f"blk.0.{name}.weight": (hidden,) for name in ("attn_norm", "ffn_norm")}
    shapes |= {f"blk.0.{name}.weight": (hidden, hidden) for name in ("attn_q", "attn_k", "attn_v", "attn_output")}
    shapes |= {"blk.0.ffn_gate.weight": (ff, hidden), "blk.0.ffn_up.weight": (ff, hidden)}
    shapes |= {"blk.0.ffn_down.weight": (hidden, ff)}
    rng = np.random.default_rng(seed)
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _written(project: Path) -> list[str]:
    """What a command left in the project besides its params, its data folder and the model files put there."""
    return sorted(p.name for p in project.iterdir() if p.name not in ("params.yaml", "data") and p.suffix != ".gguf")


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (lambda size: size - 64, "the GGUF file is truncated: its tensors reach byte"),
        (lambda size: 200, "the GGUF file ends or breaks inside its metadata (200 bytes)"),
    ],
    ids=["in its weights", "in its metadata"],
)
def test_a_truncated_gguf_is_refused_naming_the_key_before_any_stage(project, capsys, cut, message):
    whole = tiny_gguf(project / "whole.gguf").read_bytes()
    (project / "cut.gguf").write_bytes(whole[: cut(len(whole))])
    assert main(["stage", "base", "base.model_path=cut.gguf"]) == 2
    assert f"base.model_path: 'cut.gguf': {message}" in capsys.readouterr().err
    assert _written(project) == []


def test_a_gguf_of_an_architecture_transformers_does_not_read_is_refused_before_any_stage(project, capsys):
    tiny_gguf(project / "odd.gguf", architecture="nosucharch")
    assert main(["stage", "base", "base.model_path=odd.gguf"]) == 2
    err = capsys.readouterr().err
    assert "base.model_path: 'odd.gguf': the GGUF file's architecture 'nosucharch' is not one transformers loads" in err
    assert _written(project) == []


def test_a_gguf_whose_architecture_has_weights_the_file_lacks_is_refused_naming_them(project, capsys):
    """qwen2 over a Llama's weights: transformers would load a Qwen2ForCausalLM with random q/k/v biases."""
    tiny_gguf(project / "qwen2.gguf", architecture="qwen2")
    assert main(["stage", "base", "base.model_path=qwen2.gguf"]) == 2
    assert (
        "base.model_path: 'qwen2.gguf' does not load whole as a Qwen2ForCausalLM: weights it lacks: "
        "model.layers.0.self_attn.k_proj.bias, model.layers.0.self_attn.q_proj.bias, "
        "model.layers.0.self_attn.v_proj.bias"
    ) in capsys.readouterr().err
    assert _written(project) == []


def _alignflow(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["alignflow", *args], cwd=project, env=warm(), capture_output=True, text=True)


def _dvc(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["dvc", *args], cwd=project, env=warm(), capture_output=True, text=True)


@pytest.mark.slow
def test_the_lock_follows_the_source_by_content_not_by_name(tmp_path):
    """New bytes behind the same path re-run base, under plain `dvc repro` too; the same bytes under another name
    re-run nothing."""
    models = tmp_path / "models"
    models.mkdir()
    first, second = tiny_gguf(models / "first.gguf"), tiny_gguf(models / "second.gguf", seed=1)
    link = models / "model.gguf"
    link.symlink_to(first)
    project = make_project(tmp_path / "project", (f"base.model_path={link}",))
    built = _alignflow(project, "repro", "base")
    assert built.returncode == 0 and "Running stage 'base'" in built.stdout, built.stderr[-2000:]
    same = _dvc(project, "repro", "base")
    assert same.returncode == 0 and stages_run(same.stdout) == set(), same.stdout

    link.unlink()
    link.symlink_to(second)  # the same path, other bytes: DVC alone sees them
    status = _dvc(project, "status")
    assert "sources:" in status.stdout and "always changed" in status.stdout, status.stdout
    assert "up to date" not in status.stdout
    rebuilt = _dvc(project, "repro", "base")
    assert rebuilt.returncode == 0 and stages_run(rebuilt.stdout) == {"base"}, rebuilt.stdout + rebuilt.stderr[-2000:]
    recorded = OmegaConf.load(project / "artifacts/base/source.json")
    assert recorded.sha256 == hashlib.sha256(second.read_bytes()).hexdigest()
    assert "up to date" in _dvc(project, "status", "base").stdout

    renamed = shutil.copy(second, models / "renamed.gguf")  # the same bytes, another name
    lock, model = (project / "dvc.lock").read_bytes(), (project / "artifacts/base/model.safetensors").read_bytes()
    again = _alignflow(project, "repro", "base", f"base.model_path={renamed}")
    assert again.returncode == 0 and stages_run(again.stdout) == set(), again.stdout + again.stderr[-2000:]
    assert "'base' didn't change" in again.stdout
    lock_now = yaml.safe_load((project / "dvc.lock").read_bytes())["stages"]
    assert lock_now["base"] == yaml.safe_load(lock)["stages"]["base"]
    assert (project / "artifacts/base/model.safetensors").read_bytes() == model


@pytest.mark.parametrize("chat_template", [None, "{% for m in messages %}{{ m.content }}{% endfor %}"])
def test_gguf_metadata_reads_what_the_gguf_packages_reader_reads(tmp_path, chat_template):
    """The metadata validation reads (the architecture, whether there is a chat template) without the gguf
    package's reader, which takes seconds over a real vocabulary: the same keys and scalar and string values."""
    from gguf import GGUFReader, GGUFValueType

    from models.sources import gguf_metadata, has_chat_template

    path = tiny_gguf(tmp_path / "model.gguf", chat_template=chat_template)
    # the reader also lists the header's counts as fields
    reference = {key: field for key, field in GGUFReader(path).fields.items() if not key.startswith("GGUF.")}
    ours = gguf_metadata(path)
    assert set(ours) == set(reference)
    for key, field in reference.items():
        if field.types and field.types[0] != GGUFValueType.ARRAY:
            assert ours[key] == field.contents(), key
    assert has_chat_template(str(path)) == (chat_template is not None)


def test_a_gguf_source_is_validated_with_the_gguf_packages_table_without_importing_the_package(tmp_path):
    """The GGML block sizes the truncation check reads are the gguf package's own; validating a GGUF source in a
    fresh interpreter leaves the package's vocabulary helpers (mistral_common, OpenCV) unimported."""
    assert ggml_quant_sizes() == {int(kind): sizes for kind, sizes in GGML_QUANT_SIZES.items()}
    path = tiny_gguf(tmp_path / "model.gguf")
    heavy = ("gguf", "mistral_common", "cv2")
    check = (
        f"import sys; from models.sources import source_error; assert source_error({str(path)!r}) is None; "
        f"print(sorted(name for name in {heavy!r} if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
