"""The plain loop bench/gpu/smollm2_recipes.py searches with: SmolLM2 loaded from its GGUF, sampling and held-out
evaluation through the chat template, and LoRA or whole-model SFT, DPO, forward-KL distillation and on-policy GRPO,
each a few lines around the pipeline's own task, verifier, gold judge, prompt format and preference losses."""

import contextlib
import copy
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, get_cosine_schedule_with_warmup

from tasks.algos.tokens import token_logprobs
from tasks.data.judge import gold_utility, prefers_first
from tasks.data.problems import Example, arithmetic, score_response
from tasks.data.prompts import PromptFormat, finished_response_ids
from tasks.rl.preference_losses import PairLogprobs, preference_loss

FORMAT = PromptFormat("auto", "Solve the problem.")  # examples/smollm2.args' task.system_prompt
MAX_NEW_TOKENS = 40
LABEL_NOISE = 0.55  # preferences.judge.label_noise's default


class Lab:
    """The model's tokenizer, the device, the problems, and where results go."""

    def __init__(self, gguf: Path, out: Path, tiny: bool, budget_s: float) -> None:
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.autocast = self.device.type == "cuda"
        self.tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if self.tokenizer.pad_token_id is None:  # some transformers releases read no pad token from the GGUF
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.base = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        self.base.to(self.device).eval()
        self.stop_ids = [self.tokenizer.eos_token_id]
        self.out, self.tiny, self.deadline = out, tiny, time.monotonic() + budget_s
        self.train, self.test = problems(seed=0, num_train=4000, num_test=16 if tiny else 200)

    def record(self, name: str, row: dict) -> None:
        row = {"experiment": name, **row, "elapsed_s": round(time.monotonic() - self.started, 1)}
        print(json.dumps(row), flush=True)
        with self.out.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def time_left(self) -> bool:
        return time.monotonic() < self.deadline

    @contextlib.contextmanager
    def precision(self) -> Iterator[None]:
        with torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext():
            yield

    def steps(self, n: int) -> int:
        return min(n, 2) if self.tiny else n


def problems(seed: int, num_train: int, num_test: int) -> tuple[list[Example], list[Example]]:
    """Distinct 2-digit additions, the test split first so it never changes with num_train."""
    rng, seen, rows = random.Random(seed), set(), []
    while len(rows) < num_train + num_test:
        example = arithmetic.generate(rng, SimpleNamespace(digits=2, ops="+"))
        if example.prompt not in seen:
            seen.add(example.prompt)
            rows.append(example)
    return rows[num_test:], rows[:num_test]


@torch.no_grad()
def sample(lab: Lab, model: nn.Module, prompts: list[str], n: int, temperature: float, seed: int) -> list[str]:
    """n responses per prompt (prompt-major), greedy at temperature 0."""
    torch.manual_seed(seed)
    model.eval()
    tokenizer, texts = lab.tokenizer, []
    encoded = FORMAT.encode(tokenizer, prompts)
    chunk = 512 // n
    for start in range(0, len(encoded), chunk):
        rows = encoded[start : start + chunk]
        width = max(map(len, rows))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows], device=lab.device)
        attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=lab.device)
        options = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature
            else {"do_sample": False}
        )
        with lab.precision():
            generated = model.generate(
                input_ids=ids,
                attention_mask=attention,
                max_new_tokens=MAX_NEW_TOKENS,
                num_return_sequences=n,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=lab.stop_ids,
                **options,
            )
        texts += tokenizer.batch_decode(generated[:, width:], skip_special_tokens=True)
    return texts


def evaluate(lab: Lab, model: nn.Module) -> dict:
    responses = sample(lab, model, [e.prompt for e in lab.test], 1, 0.0, seed=0)
    correct = [float(score_response(e, r)[1]) for e, r in zip(lab.test, responses, strict=True)]
    gold = [gold_utility(e, r) for e, r in zip(lab.test, responses, strict=True)]
    n = len(correct)
    pass1 = sum(correct) / n
    return {
        "pass1": round(pass1, 4),
        "pass1_se": round(math.sqrt(pass1 * (1 - pass1) / n), 4),
        "gold": round(sum(gold) / n, 4),
        "correct": correct,
        "gold_each": gold,
        "example": responses[0],
    }


def gain(after: dict, before: dict) -> dict:
    """Mean gain in pass@1 and gold over the same problems, each with its paired standard error."""
    result = {}
    for key, each in (("pass1", "correct"), ("gold", "gold_each")):
        diffs = [a - b for a, b in zip(after[each], before[each], strict=True)]
        mean = sum(diffs) / len(diffs)
        var = sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)
        result[f"{key}_gain"] = round(mean, 4)
        result[f"{key}_gain_se"] = round(math.sqrt(var / len(diffs)), 4)
    return result


def summary(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("correct", "gold_each")}


def batch(lab: Lab, prompts: list[str], responses: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt + response ids, their attention mask, and the mask of response tokens."""
    tokenizer = lab.tokenizer
    prompt_ids = FORMAT.encode(tokenizer, prompts)
    rows = [p + finished_response_ids(tokenizer, r) for p, r in zip(prompt_ids, responses, strict=True)]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows], device=lab.device)
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=lab.device)
    targets = torch.tensor(
        [
            [0] * len(p) + [1] * (len(r) - len(p)) + [0] * (width - len(r))
            for p, r in zip(prompt_ids, rows, strict=True)
        ],
        device=lab.device,
    )
    return ids, attention, targets


def response_logprobs(lab: Lab, model: nn.Module, ids, attention, targets) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T-1) log-probs of each next token and the mask of the response's."""
    with lab.precision():
        logits = model(input_ids=ids, attention_mask=attention).logits
    return token_logprobs(logits[:, :-1], ids[:, 1:]), targets[:, 1:].float()


def with_lora(model: nn.Module) -> nn.Module:
    return get_peft_model(copy.deepcopy(model), LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))


def optimise(
    lab: Lab, model: nn.Module, steps: int, lr: float, warmup: int, loss_at: Callable[[int], torch.Tensor]
) -> list[float]:
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    schedule = get_cosine_schedule_with_warmup(optimizer, warmup, steps)
    losses = []
    model.train()
    for step in range(steps):
        loss = loss_at(step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def merged(model: nn.Module) -> nn.Module:
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def sft(
    lab: Lab,
    start: nn.Module,
    rows: list[tuple[str, str]],
    steps: int,
    lr: float,
    lora: bool = True,
    seed: int = 0,
    batch_size: int = 16,
) -> nn.Module:
    """LoRA (or whole-model) SFT on (prompt, response) rows, cycling through them in a seeded order."""
    model = with_lora(start) if lora else copy.deepcopy(start).requires_grad_(True)
    order = random.Random(seed).sample(range(len(rows)), len(rows))

    def loss_at(step: int) -> torch.Tensor:
        picked = [rows[order[(step * batch_size + i) % len(rows)]] for i in range(batch_size)]
        logprobs, mask = response_logprobs(lab, model, *batch(lab, *zip(*picked, strict=True)))
        return -(logprobs * mask).sum() / mask.sum()

    optimise(lab, model, lab.steps(steps), lr, min(5, steps // 4), loss_at)
    return merged(model)


def judged_pairs(lab: Lab, model: nn.Module, examples: list[Example], seed: int, noise: float) -> list[dict]:
    """The preferences stage's pairs: 4 samples a prompt, every pair of different gold utility, noisy labels."""
    responses = sample(lab, model, [e.prompt for e in examples], 4, 1.0, seed)
    rng, pairs = random.Random(f"alignflow-preferences-{seed}"), []
    for index, example in enumerate(examples):
        scored = [(r, gold_utility(example, r)) for r in responses[index * 4 : index * 4 + 4]]
        for i in range(4):
            for j in range(i + 1, 4):
                (a, ua), (b, ub) = scored[i], scored[j]
                if ua == ub or not a.strip() or not b.strip():
                    continue
                first = prefers_first(ua, ub, noise, rng)
                chosen, rejected = ((a, ua), (b, ub)) if first else ((b, ub), (a, ua))
                pairs.append(
                    {
                        "prompt": example.prompt,
                        "chosen": chosen[0],
                        "rejected": rejected[0],
                        "gold_chosen": chosen[1],
                        "gold_rejected": rejected[1],
                    }
                )
    return pairs


def dpo(
    lab: Lab,
    start: nn.Module,
    pairs: list[dict],
    steps: int,
    lr: float,
    beta: float,
    sft_weight: float,
    loss: str = "dpo",
    label_smoothing: float = 0.0,
    seed: int = 0,
    batch_size: int = 16,
) -> tuple[nn.Module, dict]:
    """LoRA DPO from ``start``, the reference being ``start`` itself (the adapters off); ``label_smoothing``: the
    share of labels taken as flipped (cdpo)."""
    model = with_lora(start)
    order = random.Random(seed).sample(range(len(pairs)), len(pairs))
    margins = []

    def loss_at(step: int) -> torch.Tensor:
        picked = [pairs[order[(step * batch_size + i) % len(pairs)]] for i in range(batch_size)]
        prompts = [p["prompt"] for p in picked] * 2
        tensors = batch(lab, prompts, [p["chosen"] for p in picked] + [p["rejected"] for p in picked])
        logprobs, mask = response_logprobs(lab, model, *tensors)
        with torch.no_grad(), model.disable_adapter():
            ref, _ = response_logprobs(lab, model, *tensors)
        sums, refs, counts = (logprobs * mask).sum(-1), (ref * mask).sum(-1), mask.sum(-1)
        scored = PairLogprobs(
            sums[:batch_size],
            sums[batch_size:],
            counts[:batch_size],
            counts[batch_size:],
            refs[:batch_size],
            refs[batch_size:],
        )
        losses, chosen, rejected = preference_loss(
            loss, scored, beta, sft_weight=sft_weight, label_smoothing=label_smoothing
        )
        margins.append((chosen - rejected).mean().item())
        return losses.mean()

    losses = optimise(lab, model, lab.steps(steps), lr, min(5, steps // 4), loss_at)
    return merged(model), {"final_loss": round(losses[-1], 4), "final_margin": round(margins[-1], 4)}


def logit_distill(
    lab: Lab,
    student_model: nn.Module,
    teacher: nn.Module,
    rows: list[tuple[str, str]],
    steps: int,
    lr: float,
    seed: int = 0,
    batch_size: int = 16,
) -> nn.Module:
    """Whole-model forward KL(teacher || student) over the response tokens of ``rows`` (GKD with beta 0, off-policy)."""
    model = copy.deepcopy(student_model).requires_grad_(True)
    order = random.Random(seed).sample(range(len(rows)), len(rows))

    def loss_at(step: int) -> torch.Tensor:
        picked = [rows[order[(step * batch_size + i) % len(rows)]] for i in range(batch_size)]
        ids, attention, targets = batch(lab, *zip(*picked, strict=True))
        with lab.precision():
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
            with torch.no_grad():
                teacher_logits = teacher(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        teacher_logp = torch.log_softmax(teacher_logits, -1)
        kl = (teacher_logp.exp() * (teacher_logp - torch.log_softmax(logits, -1))).sum(-1)
        mask = targets[:, 1:].float()
        return (kl * mask).sum() / mask.sum()

    optimise(lab, model, lab.steps(steps), lr, min(10, steps // 4), loss_at)
    return model


def grpo(
    lab: Lab, start: nn.Module, iterations: int, lr: float, seed: int, prompts: int = 16, group: int = 8
) -> nn.Module:
    """On-policy GRPO with LoRA: one update per rollout, group-normalised correctness, the token-mean loss, no KL
    (the overlay's grpo)."""
    model = with_lora(start)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    for iteration in range(lab.steps(iterations)):
        examples = rng.sample(lab.train, prompts)
        responses = sample(lab, model, [e.prompt for e in examples], group, 1.0, seed * 1000 + iteration)
        rewards = torch.tensor(
            [float(score_response(examples[i // group], r)[1]) for i, r in enumerate(responses)], device=lab.device
        ).view(prompts, group)
        advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
        model.train()
        # the token-mean over every response's tokens; rows of zero advantage add nothing but their token count
        total_tokens = sum(len(finished_response_ids(lab.tokenizer, r)) for r in responses)
        for part in range(0, len(responses), 64):
            keep = [i for i in range(part, min(part + 64, len(responses))) if advantages[i] != 0]
            if not keep:
                continue
            ids, attention, targets = batch(
                lab, [examples[i // group].prompt for i in keep], [responses[i] for i in keep]
            )
            logprobs, mask = response_logprobs(lab, model, ids, attention, targets)
            (-(advantages[keep, None] * logprobs * mask).sum() / total_tokens).backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return merged(model)
