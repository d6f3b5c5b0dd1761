"""How fast a toy-1m model trained from scratch learns to find and copy a fact (why the toy world
asks about one key, and why the base model is pretrained on short texts first).

  python -m experiments.research.probe_recall --key=random --steps=800
  python -m experiments.research.probe_recall --key=fixed --steps=400
  python -m experiments.research.probe_recall --key=fixed --filler=30 --steps=300
  python -m experiments.research.probe_recall --key=askable --facts=6 --questions=4 --steps=600
  python -m experiments.research.probe_recall --key=askable --questions=4 --fixed_steps=300 --steps=600
  python -m experiments.research.probe_recall --key=askable --facts=6 --questions=4 --preset=toy-1m-shift2 --steps=600

Rows: `--facts` facts "the code of K is V ." (each followed by `--filler` random filler words),
then `--questions` times "what is the latest code of K ? \\boxed{ V }" about distinct facts
(several: multi-query associative recall, one signal per question); the loss is the cross-entropy
of the V's only (chance: ln 24 = 3.18 nats; picking one of the facts' values at random: ln facts).
Asked keys: `fixed` always oslo, `random` any of the 24, `askable` the toy world's toy.ASKED_KEYS;
`--fixed_steps` asks about oslo for that many steps first (a curriculum).
"""

from __future__ import annotations

import random
import time

import jax
import jax.numpy as jnp
import optax
import tqdm
from absl import app, flags
from flax import nnx

import memagent_jax as mj
from memagent_jax.data import toy
from memagent_jax.models import decoder as D

flags.DEFINE_enum("key", "fixed", ["fixed", "random", "askable"],
                  "asked key: always oslo, any key, or one of toy.ASKED_KEYS")
flags.DEFINE_integer("facts", 4, "facts per row")
flags.DEFINE_integer("questions", 1, "questions per row, about distinct facts")
flags.DEFINE_integer("fixed_steps", 0, "first ask about oslo for this many steps")
flags.DEFINE_string("preset", "toy-1m", "random:<preset> model")
flags.DEFINE_integer("warmup", 20, "learning-rate warm-up steps")
flags.DEFINE_integer("filler", 0, "filler words after each fact")
flags.DEFINE_integer("steps", 400, "training steps")
flags.DEFINE_float("lr", 1e-3, "peak learning rate")
flags.DEFINE_integer("batch", 64, "rows per step")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  args = flags.FLAGS
  if not 1 <= args.questions <= args.facts:
    raise app.UsageError(f"--questions={args.questions} must lie in [1, --facts={args.facts}]")
  policy = mj.load_policy(f"random:{args.preset}", seed=0)
  tok = policy.tokenizer
  graphdef, params = nnx.split(nnx.merge(policy.graphdef, policy.state), nnx.Param)
  rng = random.Random(0)

  def row(step: int) -> tuple[list[int], list[int]]:
    """Token ids and a mask of the answer values."""
    key = "fixed" if step < args.fixed_steps else args.key
    if key == "askable":  # the asked keys first, so that every question asks an askable key
      asked = rng.sample(toy.ASKED_KEYS, args.questions)
      keys = asked + rng.sample([k for k in toy.KEYS if k not in asked], args.facts - args.questions)
      rng.shuffle(keys)
      values = [rng.choice(toy.VALUES) for _ in keys]
      qs = [keys.index(k) for k in asked]
    else:
      keys = rng.sample(toy.KEYS, args.facts)
      values = [rng.choice(toy.VALUES) for _ in keys]
      qs = rng.sample(range(args.facts), args.questions)
      if key == "fixed":
        keys[qs[0]] = "oslo" if "oslo" not in keys else keys[qs[0]]
        qs = [keys.index("oslo")] + [q for q in qs[1:] if keys[q] != "oslo"][:args.questions - 1]
    parts = [toy.fact(k, v) + "".join(" " + rng.choice(toy.FILLER_WORDS) for _ in range(args.filler))
             for k, v in zip(keys, values)]
    ids = tok.encode(" ".join(parts))
    mask = [0] * len(ids)
    for q in qs:
      asked_ids = tok.encode(f" {toy.question(keys[q])} \\boxed{{ {values[q]} }}")
      ids += asked_ids
      mask += [0] * (len(asked_ids) - 2) + [1, 0]  # the value, before the closing brace
    return ids, mask

  tx = optax.adamw(optax.linear_schedule(0.0, args.lr, args.warmup), weight_decay=0.0)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt, x, m):  # x [B, T] token ids; m [B, T] 1 on the answer values
    def value_loss(p):
      logits = D.forward_logits(nnx.merge(graphdef, p), x[:, :-1])
      nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), x[:, 1:, None], -1)[..., 0]  # [B, T-1]
      return (nll * m[:, 1:]).sum() / m[:, 1:].sum()
    loss, g = jax.value_and_grad(value_loss)(params)
    updates, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, updates), opt, loss

  t0 = time.perf_counter()
  losses = []
  print("| step | value loss (nats, mean of the last 20 steps) | seconds |\n|---|---|---|")
  for s in tqdm.trange(args.steps, desc="probe", leave=False):
    rows = [row(s) for _ in range(args.batch)]
    x = jnp.asarray([r[0] for r in rows])
    m = jnp.asarray([r[1] for r in rows], jnp.float32)
    params, opt, loss = step(params, opt, x, m)
    losses.append(float(loss))
    if (s + 1) % 100 == 0 or s == args.steps - 1:
      tqdm.tqdm.write(f"| {s + 1} | {sum(losses[-20:]) / len(losses[-20:]):.3f} | "
                      f"{time.perf_counter() - t0:.0f} |")


if __name__ == "__main__":
  app.run(main)
