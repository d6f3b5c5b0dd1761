"""How fast a toy-1m model trained from scratch learns to find and copy a fact (why the toy world
asks about one key, and why the base model is pretrained on short texts first).

  python experiments/probe_recall.py --key=random --steps=800
  python experiments/probe_recall.py --key=fixed --steps=400
  python experiments/probe_recall.py --key=fixed --filler=30 --steps=300

Rows: `--facts` facts "the code of K is V ." (each followed by `--filler` random filler words),
then "what is the latest code of K ? \\boxed{ V }"; the loss is the cross-entropy of V only
(chance: ln 24 = 3.18 nats; picking one of the facts' values at random: ln facts).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--key", choices=["fixed", "random"], default="fixed", help="asked key: always oslo, or any")
  p.add_argument("--facts", type=int, default=4)
  p.add_argument("--filler", type=int, default=0, help="filler words after each fact")
  p.add_argument("--steps", type=int, default=400)
  p.add_argument("--lr", type=float, default=1e-3)
  p.add_argument("--batch", type=int, default=64)
  args = p.parse_args(argv)
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  import memagent_jax as mj
  from memagent_jax.data import toy
  from memagent_jax.models import decoder as D

  policy = mj.load_policy("random:toy-1m", seed=0)
  tok = policy.tokenizer
  graphdef, params = nnx.split(nnx.merge(policy.graphdef, policy.state), nnx.Param)
  rng = random.Random(0)

  def row():
    keys = rng.sample(toy.KEYS, args.facts)
    values = [rng.choice(toy.VALUES) for _ in keys]
    q = rng.randrange(args.facts)
    if args.key == "fixed":
      keys[q] = "oslo" if "oslo" not in keys else keys[q]
      q = keys.index("oslo")
    parts = [toy.fact(k, v) + "".join(" " + rng.choice(toy.FILLER_WORDS) for _ in range(args.filler))
             for k, v in zip(keys, values)]
    return tok.encode(" ".join(parts) + f" {toy.question(keys[q])} \\boxed{{ {values[q]} }}")

  tx = optax.adamw(optax.linear_schedule(0.0, args.lr, 20), weight_decay=0.0)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt, x):  # x [B, T]; the value is the second-to-last token
    def value_loss(p):
      logits = D.forward_logits(nnx.merge(graphdef, p), x[:, :-1])
      lp = jax.nn.log_softmax(logits)
      return -jnp.take_along_axis(lp, x[:, 1:, None], -1)[:, -2, 0].mean()
    loss, g = jax.value_and_grad(value_loss)(params)
    updates, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, updates), opt, loss

  t0 = time.perf_counter()
  print("| step | value loss (nats) | seconds |\n|---|---|---|")
  for s in range(args.steps):
    x = jnp.asarray([row() for _ in range(args.batch)])
    params, opt, loss = step(params, opt, x)
    if s % 100 == 0 or s == args.steps - 1:
      print(f"| {s} | {float(loss):.3f} | {time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
  main()
