"""How an observation (a tool's result, an environment's reply) is put to the model: its text rendered as the chat
template's tool turn and the next assistant turn's header, or, for a model without a template, as
``"\\n<tool_response>" + text + "</tool_response>\\n"``. The episodes of a rollout and SFT on worked traces encode
observations here, so the trainer sees the ids the engine saw."""

from typing import Any

from tasks.data.problems import TaskError

# A conversation the observation's tool turn is rendered after, to take the template's text for the turn alone.
_DUMMY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hi."},
    {"role": "assistant", "content": "Hello."},
]


class ObservationFormat:
    """How an observation's text becomes the ids that follow a model turn (its end-of-turn token included)."""

    def __init__(self, tokenizer: Any, uses_template: bool, stop_ids: list[int]):
        self.tokenizer, self.uses_template = tokenizer, uses_template
        if uses_template:
            base = tokenizer.apply_chat_template(_DUMMY, tokenize=False)
            stops = [tokenizer.convert_ids_to_tokens(i) for i in stop_ids]
            end = max((base.rfind(stop) + len(stop) for stop in stops if stop in base), default=None)
            if end is None:
                raise TaskError(f"the chat template ends an assistant turn with none of the stop tokens {stops}")
            # The template's text after the assistant's end-of-turn token ("\n" in ChatML): the model stops at
            # that token, so what the template puts between it and the next turn comes with the observation.
            self.base, self.separator = base, base[end:]

    def encode(self, text: str) -> list[int]:
        if not self.uses_template:
            return self.tokenizer(f"\n<tool_response>{text}</tool_response>\n", add_special_tokens=False)["input_ids"]
        tool = [*_DUMMY, {"role": "tool", "content": text}]
        full = self.tokenizer.apply_chat_template(tool, add_generation_prompt=True, tokenize=False)
        if not full.startswith(self.base):
            raise TaskError("the model's chat template renders a conversation differently once a tool turn follows")
        return self.tokenizer(self.separator + full[len(self.base) :], add_special_tokens=False)["input_ids"]
