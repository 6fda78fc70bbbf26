"""On-policy distillation in the RL loop: the student moves toward the teacher under each loss, the teacher stays
frozen, GKD's teacher batches, and a teacher or student with another vocabulary is refused before any work."""

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from flows.cli import main
from models import build_char_tokenizer, build_tiny_llama, load_tokenizer
from models.student import kept_layers, student_of
from tasks.common.config import BaseConfig, ConfigError, Params
from tasks.common.training import make_deterministic
from tasks.data.problems import Example
from tasks.data.prompts import BARE, finished_response_ids
from tasks.params.load import load_params
from tasks.rl.distill_losses import DISTILL_LOSSES
from tasks.rl.distillation import distill_roles, learn_distillation, teacher_batches
from tasks.rl.learner import LoopState
from tasks.rl.placement import place
from tasks.rl.sequences import response_logprobs_and_logits
from tasks.rl.trainer import collect
from tests.conftest import tiny_model
from tests.test_rl_loop import DigitScorer, new_clock

SEED = 0


def _sharp_model(path: Path, seed: int, tokenizer=None, sharpness: float = 4.0, noise: float = 0.0) -> Path:
    """A random tiny Llama whose next-token distributions are peaked (its tied embeddings scaled up), so a student
    has somewhere definite to go; ``noise`` perturbs every weight by that fraction of its tensor's std."""
    tokenizer = tokenizer or build_char_tokenizer()
    size = BaseConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    model = build_tiny_llama(size, tokenizer, seed)
    generator = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(sharpness)
        for tensor in model.parameters():
            tensor.add_(torch.randn(tensor.shape, generator=generator) * noise * tensor.std())
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> Path:
    return _sharp_model(tmp_path_factory.mktemp("teacher"), seed=1)


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory) -> Path:
    """The teacher with its weights perturbed: a student that half knows what the teacher does, as after SFT on
    the teacher's samples (from a random start the sampled-token signal is too sparse for a short test)."""
    return _sharp_model(tmp_path_factory.mktemp("student"), seed=1, noise=0.5)


def _exact_reverse_kl(roles, batch) -> float:
    """KL(π_s ‖ π_t) per token over the whole vocabulary, on ``batch``."""
    with torch.no_grad():
        student = response_logprobs_and_logits(roles.actor.local.model, batch, 1.0)[1]
    divergence = DISTILL_LOSSES["gkd"](student, roles.teacher.local.logits(batch), batch.response_mask, beta=1.0)
    return (divergence.sum() / batch.response_mask.sum()).item()


@pytest.mark.parametrize(("loss", "beta"), [("reverse_kl", 0.5), ("gkd", 0.5), ("gkd", 0.0), ("gkd", 1.0)])
def test_on_policy_distillation_moves_the_student_toward_a_frozen_teacher(
    student_dir, teacher_dir, one_thread, loss, beta
):
    """15 iterations of collect + learn: the student's exact reverse KL to the teacher on a fixed batch of its
    first samples falls by 40% or more, and the teacher's weights do not move."""
    steps = 15
    cfg = replace(
        Params().distill,
        distill_loss=loss,
        jsd_beta=beta,
        steps=steps,
        rollout_batch_size=8,
        group_size=4,
        actor_lr=3e-3,
        warmup_steps=0,
        max_new_tokens=8,
    )
    params = Params(seed=SEED, device="cpu")
    make_deterministic(SEED)
    roles = place(params, cfg, student_dir, [], distill_roles(cfg), teacher_dir)
    tokenizer, state = load_tokenizer(student_dir), LoopState()
    examples = [Example("arithmetic", f"{a}+{b}=", str(a + b), "") for a in range(4) for b in range(4)]
    first, _ = collect(roles, DigitScorer(), examples, cfg, LoopState(), SEED + 1, new_clock())
    fixed = first.packed(tokenizer)
    before, history = _exact_reverse_kl(roles, fixed), []
    for _ in range(steps):
        rollout, _ = collect(roles, DigitScorer(), examples, cfg, state, SEED, new_clock())
        history.append(learn_distillation(roles, rollout, tokenizer, cfg, state, new_clock()))
    assert _exact_reverse_kl(roles, fixed) < 0.6 * before
    assert history[0]["logprob_parity"] < 1e-4  # the student sampled with the weights it trains
    on_disk = load_file(teacher_dir / "model.safetensors")
    in_role = roles.teacher.local.model.state_dict()
    assert all(torch.equal(in_role[name], tensor) for name, tensor in on_disk.items())


def test_a_verifier_reward_adds_its_advantage_to_the_teachers(student_dir, teacher_dir, one_thread):
    """reward_coef scales the reward's advantage beside the dense one: with a reward the update differs, and at
    reward_coef 0 the reward does not enter at all (the same update as without any reward function)."""

    def first_update(**changes) -> dict[str, float]:
        cfg = replace(Params().distill, rollout_batch_size=4, group_size=4, max_new_tokens=6, **changes)
        make_deterministic(SEED)
        roles = place(Params(seed=SEED, device="cpu"), cfg, student_dir, [], distill_roles(cfg), teacher_dir)
        examples = [Example("arithmetic", f"{a}+1=", str(a + 1), "") for a in range(8)]
        rollout, _ = collect(roles, DigitScorer(), examples, cfg, LoopState(), SEED, new_clock())
        return learn_distillation(roles, rollout, load_tokenizer(student_dir), cfg, LoopState(), new_clock())

    without, zero = first_update(rewards={}), first_update(reward_coef=0.0)
    assert without["policy_loss"] == zero["policy_loss"]
    assert first_update(reward_coef=1.0)["policy_loss"] != zero["policy_loss"]


def test_the_rollout_correction_weighs_the_students_samples_and_leaves_the_teachers_responses(
    student_dir, teacher_dir, one_thread
):
    """With token weights on, an iteration on the student's own samples logs them (the engine is the trainer's
    fp32 policy: ratios of 1), and one on the teacher's responses, which no engine sampled, trains uncorrected."""
    cfg = replace(Params().distill, distill_loss="gkd", lmbda=0.5, rollout_batch_size=4, group_size=2)
    cfg = replace(cfg, max_new_tokens=6, rollout_correction=replace(cfg.rollout_correction, weights="token"))
    make_deterministic(SEED)
    roles = place(Params(seed=SEED, device="cpu"), cfg, student_dir, [], distill_roles(cfg), teacher_dir)
    tokenizer = load_tokenizer(student_dir)
    examples = [Example("arithmetic", f"{a}+1=", str(a + 1), f"<answer>{a + 1}</answer>") for a in range(8)]
    sampled, _ = collect(roles, DigitScorer(), examples, cfg, LoopState(), SEED, new_clock())
    on_policy = learn_distillation(roles, sampled, tokenizer, cfg, LoopState(), new_clock())
    assert on_policy["is_weight"] == pytest.approx(1.0, abs=1e-4) and on_policy["mismatch_kl"] < 1e-6
    teachers = teacher_batches(examples, tokenizer, BARE, cfg, SEED)(0)
    off_policy = learn_distillation(roles, teachers, tokenizer, cfg, LoopState(), new_clock())
    assert "is_weight" not in off_policy and all(map(math.isfinite, off_policy.values()))


@pytest.mark.parametrize(("lmbda", "teacher_iterations"), [(1.0, []), (0.5, [0, 2, 4, 6]), (0.25, [0, 1, 2, 4, 5, 6])])
def test_gkd_lambda_leaves_an_even_share_of_iterations_to_the_teachers_responses(
    student_dir, lmbda, teacher_iterations
):
    tokenizer = load_tokenizer(student_dir)
    sums = [(a, b) for a in range(5) for b in range(5)]
    examples = [Example("arithmetic", f"{a}+{b}=", str(a + b), f"<answer>{a + b}</answer>") for a, b in sums]
    cfg = replace(Params().distill, distill_loss="gkd", lmbda=lmbda, rollout_batch_size=3, group_size=2)
    draw = teacher_batches(examples, tokenizer, BARE, cfg, SEED)
    drawn = {i: draw(i) for i in range(8)}
    assert [i for i, rollout in drawn.items() if rollout is not None] == teacher_iterations
    for rollout in filter(None, drawn.values()):
        assert not rollout.on_policy and len(rollout.examples) == 6
        for example, completion in zip(rollout.examples, rollout.completions, strict=True):
            assert completion.token_ids == finished_response_ids(tokenizer, example.solution)


def test_a_teacher_with_another_vocabulary_is_refused_before_any_training(project, student_dir, capsys):
    other = build_char_tokenizer()
    other.add_tokens(["§"])
    _sharp_model(project / "artifacts/grpo", seed=1, tokenizer=other)
    tiny_model(project / "artifacts/sft_distill")
    (project / "artifacts/data").mkdir()
    assert main(["stage", "distill"]) == 2
    error = capsys.readouterr().err
    assert "distill.teacher: the tokenizer of grpo is not the student's (distill.init=sft_distill)" in error
    assert f"{len(build_char_tokenizer())} tokens against the teacher's {len(other)}; first difference: '§'" in error
    assert not (project / "artifacts/distill").exists() and not (project / ".alignflow").exists()


def test_a_student_model_path_with_another_vocabulary_is_refused_when_params_load(tmp_path):
    other = build_char_tokenizer()
    other.add_tokens(["§"])
    student = _sharp_model(tmp_path / "student", seed=2, tokenizer=other)
    with pytest.raises(ConfigError, match="student_base.model_path: the tokenizer of .* is not the teacher's"):
        load_params(Path(__file__).parents[1] / "params.yaml", [f"student_base.model_path={student}"])
    same = _sharp_model(tmp_path / "same", seed=2)
    assert load_params(Path(__file__).parents[1] / "params.yaml", [f"student_base.model_path={same}"])


@pytest.mark.parametrize(("teacher_layers", "num_layers"), [(30, 14), (30, 15), (7, 3), (5, 5), (4, 1), (2, 2)])
def test_a_student_from_the_teacher_keeps_evenly_spaced_layers_first_and_last(teacher_layers, num_layers):
    keep = kept_layers(teacher_layers, num_layers)
    assert len(keep) == len(set(keep)) == num_layers and keep == sorted(keep)
    assert keep[0] == 0 and (num_layers == 1 or keep[-1] == teacher_layers - 1)
    gaps = [b - a for a, b in zip(keep, keep[1:], strict=False)]
    assert not gaps or max(gaps) - min(gaps) <= 1  # as even as whole layers allow


def test_a_student_from_the_teacher_computes_the_teachers_kept_layers(tmp_path):
    """The student made of layers 0 and 3 of a 4-layer teacher computes what the teacher's own modules do with only
    those two layers, cached generation included (each layer finds its cache slot); every other weight is the
    teacher's, and it saves and loads as a 2-layer model."""
    tokenizer = build_char_tokenizer()
    teacher = build_tiny_llama(
        BaseConfig(hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64), tokenizer, 3
    )
    teacher.save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")
    student = student_of(tmp_path / "teacher", 2).eval()
    ids = torch.tensor([tokenizer("12+34=46")["input_ids"]])
    with torch.no_grad():
        hidden = teacher.model.embed_tokens(ids)
        positions = teacher.model.rotary_emb(hidden, torch.arange(ids.shape[1])[None])
        mask = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)[None, None]
        for index in (0, 3):
            hidden = teacher.model.layers[index](hidden, attention_mask=mask, position_embeddings=positions)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        expected = teacher.lm_head(teacher.model.norm(hidden))
        assert torch.allclose(student(ids).logits, expected, atol=1e-5)
        cached = student.generate(ids, max_new_tokens=6, do_sample=False)
        uncached = student.generate(ids, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)
    student.save_pretrained(tmp_path / "student")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "student")
    assert loaded.config.num_hidden_layers == 2
    for name, tensor in loaded.state_dict().items():
        source = name.replace("layers.1.", "layers.3.")
        assert torch.equal(tensor, teacher.state_dict()[source]), name


def test_a_student_from_the_teacher_takes_no_model_path():
    with pytest.raises(ConfigError, match="student_base.model_path: unused with student_base.from_teacher"):
        load_params(
            Path(__file__).parents[1] / "params.yaml",
            ["student_base.from_teacher=true", "student_base.model_path=/models/student"],
        )
