"""MemAgent's prompts, byte for byte as released, and their pre-tokenised chat-wrapped segments.

The released RL-MemAgent checkpoints were trained on exactly these texts (MEMAGENT_FACTS.md
section 1): note the space after `<problem>` and the newline after the last line. Each prompt
is one user turn wrapped by the tokenizer's chat template with the generation prompt.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from memagent_jax.text import answers

NO_MEMORY = "No previous memory"

MEMORY_TEMPLATE = """You are presented with a problem, a section of an article that may contain the answer to the problem, and a previous memory. Please read the provided section carefully and update the memory with the new information that helps to answer the problem. Be sure to retain all relevant details from the previous memory while adding any new, useful information.

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:
"""

FINAL_TEMPLATE_BOXED = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{{}}.

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""

# The released evaluation variant replaces the instruction sentence; its answer is the text
# after the last "the answer is".
BOXED_INSTRUCTION = "put the answer in \\boxed{{}}."
EVAL_INSTRUCTION = ('format your response as follows "Therefore, the answer is (insert answer '
                    'here)".')
FINAL_TEMPLATE_EVAL = FINAL_TEMPLATE_BOXED.replace(BOXED_INSTRUCTION, EVAL_INSTRUCTION)

# Baseline without memory: the whole (or centre-truncated) document in one prompt.
DIRECT_TEMPLATE = """You are presented with a problem and an article that may contain the answer to the problem. Please read the article carefully and answer the problem based on it and put the answer in \\boxed{{}}.

<problem> 
{prompt}
</problem>

<article>
{context}
</article>

Your answer:
"""

FINAL_TEMPLATES = {"boxed": FINAL_TEMPLATE_BOXED, "eval": FINAL_TEMPLATE_EVAL}

# Gated memory (agent.memory="gated"): MEMORY_TEMPLATE with sentences after its instruction that name
# the short forms a memory turn may reply with instead of a new memory (agent/gates.py parses them).
# The released template above is untouched: overwrite memory prompts stay byte for byte.
MEMORY_INSTRUCTION_END = "while adding any new, useful information."
KEEP_SENTENCE = " If the section holds nothing that helps to answer the problem, reply only <keep> and the memory stays unchanged."
STOP_SENTENCE = " If the memory already holds enough to answer the problem, reply only <stop> and reading stops."
GATED_MEMORY_TEMPLATES = {
    "keep": MEMORY_TEMPLATE.replace(MEMORY_INSTRUCTION_END, MEMORY_INSTRUCTION_END + KEEP_SENTENCE),
    "keep_stop": MEMORY_TEMPLATE.replace(MEMORY_INSTRUCTION_END, MEMORY_INSTRUCTION_END + KEEP_SENTENCE + STOP_SENTENCE),
}


def memory_template(memory: str = "overwrite", gate_forms: str = "keep") -> str:
  """The memory-update template of a memory kind: the released one for "overwrite"; for "gated",
  the one naming the forms of `gate_forms`."""
  if memory == "overwrite":
    return MEMORY_TEMPLATE
  if memory != "gated" or gate_forms not in GATED_MEMORY_TEMPLATES:
    raise ValueError(f"memory={memory!r}, gate_forms={gate_forms!r}; choose memory 'overwrite', or 'gated' "
                     f"with gate_forms in {sorted(GATED_MEMORY_TEMPLATES)}")
  return GATED_MEMORY_TEMPLATES[gate_forms]


@dataclasses.dataclass(frozen=True)
class TemplateSegments:
  """A chat-wrapped template cut at its placeholders into token segments.

  `pieces[i]` are the ids of the fixed text before placeholder `fields[i]`; `pieces[-1]` follows
  the last one (it ends with the generation prompt). A prompt is pieces interleaved with the
  ids of the fields, so ids are concatenated, never re-tokenised.
  """
  fields: tuple[str, ...]
  pieces: tuple[np.ndarray, ...]  # each [L_i] int32

  @classmethod
  def build(cls, tokenizer, template: str) -> "TemplateSegments":
    fields = tuple(re.findall(r"(?<!\{)\{(\w+)\}(?!\})", template))
    marks = {f: f"\x00@{f}@\x00" for f in fields}
    text = tokenizer.chat_text(template.format(**marks))
    pieces = []
    for f in fields:
      before, text = text.split(marks[f], 1)
      pieces.append(np.asarray(tokenizer.encode(before), np.int32))
    pieces.append(np.asarray(tokenizer.encode(text), np.int32))
    return cls(fields, tuple(pieces))

  @property
  def fixed_tokens(self) -> int:
    """Tokens of template text (chat wrapping included), without the fields."""
    return int(sum(len(p) for p in self.pieces))

  def assemble(self, **field_ids) -> list[int]:
    """The prompt ids for given field ids, on the host (the plain reference of the compiled path)."""
    out = []
    for piece, f in zip(self.pieces, self.fields):
      out += piece.tolist() + list(field_ids[f])
    return out + self.pieces[-1].tolist()


def answer_text_to_prediction(answer: str, final_template: str) -> str | None:
  """What the final answer claims: the boxed content (training variant) or the text after the
  last 'the answer is' (evaluation variant); None when the answer does not follow its format."""
  if final_template == "eval":
    return answers.answer_after_marker(answer)
  return answers.extract_boxed(answer)
