"""A tiny word-level tokenizer for the toy memory world, behind the agent's `Tokenizer` interface.

It is a real Hugging Face fast tokenizer (`tokenizers.models.WordLevel` wrapped in
`transformers.PreTrainedTokenizerFast`), so `save_pretrained` writes a standard tokenizer.json
that `AutoTokenizer.from_pretrained` reloads with identical ids, and the ChatML chat template
works through `Tokenizer.chat_text`.

Tokenisation: whitespace separates words and is dropped (spaces AND newlines: there is no
newline token, so the templates' line structure is flattened; their tags delimit the fields).
Within a word, `\\boxed{`, tags like `<problem>` / `</memory>`, runs of word characters and
single punctuation characters are tokens. Decoding joins tokens with single spaces, so text in
that canonical spacing (what `memagent_jax.data.toy` emits) round-trips exactly, and an answer
decodes as `\\boxed{ tiger }`, which `rewards.extract_boxed` reads (its content is stripped by
every metric).

The vocabulary is every token of the MemAgent templates, the chat-template roles and the toy
world's words, sorted after the special tokens, then the few tokens only the gated memory's
templates use (`<keep>`, `<stop>`, their sentences), appended so that no earlier id moves:
deterministic and a few hundred items.
"""

from __future__ import annotations

import functools
import re

from memagent_jax.data import toy
from memagent_jax.text import templates as T
from memagent_jax.text.tokenizer import Tokenizer

PAD, UNK, IM_START, IM_END, END_OF_TEXT = "<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD, UNK, IM_START, IM_END, END_OF_TEXT)  # ids 0..4, in this order
CHAT_ROLES = ("assistant", "system", "user")
# Tokens inside a whitespace-free word: the answer box opener, tags, word runs, punctuation.
WORD_PATTERN = r"\\boxed\{|</?\w+>|\w+|[^\w\s]"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _pre_tokenizer():
  # lazy: data/ modules stay import-light; only splitting or building toy text needs tokenizers
  from tokenizers import Regex, pre_tokenizers
  return pre_tokenizers.Sequence([
      pre_tokenizers.WhitespaceSplit(),
      pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated"),
  ])


def split_words(text: str) -> list[str]:
  """The tokens a text pre-tokenises into (the same rule the tokenizer applies)."""
  return [w for w, _ in _pre_tokenizer().pre_tokenize_str(text)]


def template_words() -> set[str]:
  """Every token of the MemAgent templates (fields left empty) and the initial memory."""
  texts = [T.MEMORY_TEMPLATE, T.DIRECT_TEMPLATE, *T.FINAL_TEMPLATES.values()]
  words = {w for t in texts
           for w in split_words(t.format(**{f: "" for f in re.findall(r"(?<!\{)\{(\w+)\}(?!\})", t)}))}
  return words | set(split_words(T.NO_MEMORY))


def gated_words(base: set[str]) -> list[str]:
  """Tokens of the gated memory templates (forms included) not in `base`, sorted: appended after the
  original vocabulary, so every earlier id stays (the embedding's padded rows hold them)."""
  texts = list(T.GATED_MEMORY_TEMPLATES.values())
  words = {w for t in texts for w in split_words(t.format(prompt="", memory="", chunk=""))}
  return sorted(words - base)


def base_vocabulary() -> list[str]:
  """Special tokens, then the sorted union of template, chat-role and toy-world tokens: the vocabulary
  of the toy world before the gated memory (the committed toy checkpoints' tokenizer)."""
  words = template_words() | set(CHAT_ROLES) | set(toy.vocabulary_words())
  return list(SPECIAL_TOKENS) + sorted(words - set(SPECIAL_TOKENS))


def vocabulary() -> list[str]:
  """`base_vocabulary()`, then the gated memory's tokens (appended: no earlier id moves)."""
  base = base_vocabulary()
  return base + gated_words(set(base))


def build_hf_tokenizer(words: list[str] | None = None):
  """The `PreTrainedTokenizerFast` over `words` (default: `vocabulary()`)."""
  # lazy: transformers takes ~1-3 s to import; only building the toy tokenizer needs it
  from tokenizers import Tokenizer as RawTokenizer, decoders, models
  from transformers import PreTrainedTokenizerFast
  words = vocabulary() if words is None else list(words)
  raw = RawTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=UNK))
  raw.pre_tokenizer = _pre_tokenizer()
  # WordPiece with a prefix no token has and no cleanup = join with single spaces, explicitly.
  raw.decoder = decoders.WordPiece(prefix="##", cleanup=False)
  raw.add_special_tokens(list(SPECIAL_TOKENS))
  return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token=PAD, unk_token=UNK, eos_token=IM_END,
                                 clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE)


class UnknownWordError(ValueError):
  """A text holds a word outside the closed toy vocabulary."""


class WordTokenizer(Tokenizer):
  """`Tokenizer` whose `encode` refuses words outside the vocabulary instead of emitting <unk>.

  Every toy text is generated from the vocabulary, so an unknown word is a bug to surface, not
  to lose. One exception keeps streaming chunking working (`agent.chunking.is_clean_cut` encodes
  windows cut mid-word): an unknown piece touching the start or end of the text that is a
  fragment (substring) of a vocabulary token becomes <unk> silently.
  """

  def __init__(self, hf_tokenizer):
    super().__init__(hf_tokenizer)
    self.unk_token_id = hf_tokenizer.unk_token_id
    self._joined_vocab = "\x00".join(hf_tokenizer.get_vocab())

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    return self._checked(text, super().encode(text, add_special_tokens))

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    return [self._checked(t, ids) for t, ids in zip(texts, super().encode_batch(texts), strict=True)]

  def _checked(self, text: str, ids: list[int]) -> list[int]:
    if self.unk_token_id in ids:
      self._raise_unknown(text)
    return ids

  def _raise_unknown(self, text: str):
    enc = self.hf.backend_tokenizer.encode(text, add_special_tokens=False)
    for i, (start, end) in zip(enc.ids, enc.offsets):
      if i != self.unk_token_id:
        continue
      word = text[start:end]
      at_edge = start == 0 or end == len(text)
      if not (at_edge and word != UNK and word in self._joined_vocab):
        raise UnknownWordError(f"word {word!r} (characters {start}:{end}) is not in the toy "
                               f"vocabulary of {self.vocab_size} tokens")


def with_gated_words(tokenizer):
  """The current toy tokenizer in place of a toy checkpoint's tokenizer saved before the gated memory's
  words joined the vocabulary (its ids are the current one's first ids, so the checkpoint's embedding reads
  every one unchanged); any other tokenizer as it is. Gated readers of such checkpoints need `<keep>`."""
  base = base_vocabulary()
  if tokenizer is None or tokenizer.hf.get_vocab() != {w: i for i, w in enumerate(base)}:
    return tokenizer
  return toy_tokenizer()


@functools.lru_cache(maxsize=1)
def toy_tokenizer() -> WordTokenizer:
  """The toy world's tokenizer (cached: building it pre-tokenises every template)."""
  return WordTokenizer(build_hf_tokenizer())
