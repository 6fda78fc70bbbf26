"""How a task's prompt becomes the token ids a model reads, and which tokens end its response.

A model with a chat template (an instruct model) is asked as it was trained to be asked: the prompt is the user's
message, after the task's system prompt if it sets one, rendered by the tokenizer's template with the assistant's
turn opened (``task.chat_template``: auto uses a template when the tokenizer has one, always requires one, never
sends the bare text). Every place that turns a prompt into ids (the engines, the trainers, the reward models, length
checks) goes through ``PromptFormat.encode``, so all of them see the same ids.

A response prefix (``task.response_prefix``: R1-Zero's ``<think>``) opens the assistant's turn for the model to
continue: ``encode`` ends every prompt with it, and a response's text holds it in front (what the engines return,
what verifiers, judges and datasets read), so ``response_ids`` takes it off again before tokenizing a response
that follows an encoded prompt.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tasks.data.problems.example import Example, is_trace


class PromptFormatError(ValueError):
    """A prompt format the tokenizer cannot give (a chat template required and absent)."""


@dataclass(frozen=True)
class PromptFormat:
    chat_template: str  # one of CHAT_TEMPLATE_MODES (tasks/common/config/task.py)
    system_prompt: str | None  # None: the template's own default, if it has one
    response_prefix: str = ""  # the text every response starts with, written into the prompt

    @classmethod
    def of(cls, task: Any) -> "PromptFormat":
        """The format ``task`` (params.task) asks for."""
        return cls(task.chat_template, task.system_prompt, task.response_prefix)

    def uses_template(self, tokenizer: Any) -> bool:
        """Whether prompts go through ``tokenizer``'s chat template; PromptFormatError when one is required, absent."""
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if self.chat_template == "always" and not has_template:
            raise PromptFormatError(
                "task.chat_template is 'always' but the model's tokenizer has no chat template (set it to auto or "
                "never, or start from a model that has one)"
            )
        return has_template and self.chat_template != "never"

    def messages(self, prompt: str) -> list[dict[str, str]]:
        system = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        return [*system, {"role": "user", "content": prompt}]

    def control_token_in(self, tokenizer: Any, text: str) -> str | None:
        """The first of the tokenizer's control tokens (``<|im_end|>``, ``</s>``) that ``text`` holds: the tokenizer
        would read it as that control token, not as text, ending a turn where the text meant none."""
        return next((token for token in tokenizer.all_special_tokens if token and token in text), None)

    def encode(self, tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
        """The token ids of each prompt, as the model reads it before its response's first token; PromptFormatError
        for a prompt or system prompt holding one of the tokenizer's control tokens."""
        settings = (("task.system_prompt", self.system_prompt or ""), ("task.response_prefix", self.response_prefix))
        for where, text in (*settings, *(("a prompt", p) for p in prompts)):
            if token := self.control_token_in(tokenizer, text):
                raise PromptFormatError(f"{where} holds {token!r}, a control token of the model's tokenizer: {text!r}")
        if not self.uses_template(tokenizer):
            return tokenizer([prompt + self.response_prefix for prompt in prompts])["input_ids"]
        rendered = [
            tokenizer.apply_chat_template(self.messages(prompt), add_generation_prompt=True, tokenize=False)
            + self.response_prefix
            for prompt in prompts
        ]
        # The template writes whatever beginning-of-sequence token the model expects; adding one would double it.
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]

    def multi_turn(self) -> "PromptFormat":
        """The format of an episode of several model turns (an agent task's): without the response prefix, which
        opens a single-turn response; an episode's turns open as the model opens them."""
        return PromptFormat(self.chat_template, self.system_prompt)

    def for_example(self, example: Example) -> "PromptFormat":
        """The format ``example``'s prompt is asked in: an agent task's trace opens its turns itself (``multi_turn``),
        any other response follows the prefix."""
        return self.multi_turn() if is_trace(example) else self

    def encode_examples(self, tokenizer: Any, examples: Sequence[Example]) -> list[list[int]]:
        """``encode`` of each example's prompt in its own format (``for_example``), one tokenizer call per format."""
        ids: list[list[int]] = [[] for _ in examples]
        forms = [self.for_example(example) for example in examples]
        for form in set(forms):
            rows = [row for row, its_form in enumerate(forms) if its_form == form]
            for row, encoded in zip(rows, form.encode(tokenizer, [examples[row].prompt for row in rows]), strict=True):
                ids[row] = encoded
        return ids

    def response_text(self, generated: str) -> str:
        """The whole response to an encoded prompt whose model wrote ``generated``: the prefix, then it."""
        return self.response_prefix + generated

    def response_ids(self, tokenizer: Any, response: str) -> list[int]:
        """The token ids a model writes after an encoded prompt to give ``response`` (the prefix is the prompt's),
        then end-of-sequence; PromptFormatError for a response that does not start with the prefix."""
        if not response.startswith(self.response_prefix):
            raise PromptFormatError(
                f"a response does not start with task.response_prefix {self.response_prefix!r}: {response[:80]!r}"
            )
        return finished_response_ids(tokenizer, response[len(self.response_prefix) :])


def finished_response_ids(tokenizer: Any, response: str) -> list[int]:
    """The token ids of ``response`` as a model ends it: no beginning-of-sequence, then end-of-sequence."""
    return tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


BARE = PromptFormat("never", None)  # the prompt's text as it is: a model without a chat template reads it so


def stop_token_ids(tokenizer: Any, generation_config: Any) -> list[int]:
    """The tokens that end a response: the tokenizer's end-of-sequence and every end-of-turn token the model's
    generation config names (an instruct model's template ends a turn with one; Qwen's differs from its EOS)."""
    configured = getattr(generation_config, "eos_token_id", None)
    configured = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    return sorted({tokenizer.eos_token_id, *configured})
