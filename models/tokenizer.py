"""A character-level tokenizer in Hugging Face format.

One token per character, except the response-format tags, which are single
tokens so that a worked solution is short. Built on ``tokenizers`` (WordLevel
model, regex split, Fuse decoder) and wrapped in ``PreTrainedTokenizerFast`` so
it saves as ``tokenizer.json`` and loads with ``AutoTokenizer`` and vLLM.
"""

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
FORMAT_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate([PAD, BOS, EOS, UNK, *FORMAT_TAGS, *CHARACTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tags = "|".join(FORMAT_TAGS)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(rf"{tags}|[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )
