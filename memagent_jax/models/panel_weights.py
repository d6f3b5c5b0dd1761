"""Decode's large projection weights packed once in column panels for the CPU kernel of few rows
(`runtime/cpu_panel_matmul`): a copy of the model whose weights also carry their panels, made before a
decode loop, so each decode step reads every weight as one stream (the packing itself reads and writes the
weights once per loop). Prefill and training never see it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax.runtime import cpu_panel_matmul

# Models whose weights are smaller than this stay in the processor's caches from step to step, where XLA's
# products read them fast enough (the toy models' 4.5 MB among them: their floats never depend on the kernel).
MIN_MODEL_BYTES = 64 << 20
# The panels are a second copy of the weights while a decode loop runs: past this, XLA's products.
MAX_MODEL_BYTES = 4 << 30


@jax.tree_util.register_pytree_node_class
class PanelWeight:
  """A weight's array (for every other use) and its panels [T, K, 48] for products x [..., K] @ w, w seen
  as [K, N]; reshapes keep the panels (they change the view, not the product)."""

  def __init__(self, value, panels):
    self.value, self.panels = value, panels

  shape = property(lambda self: self.value.shape)

  def __getitem__(self, key):  # a Param read, `param[...]`
    if key is not Ellipsis:
      raise TypeError(f"a PanelWeight is read whole (param[...]), not at {key!r}")
    return self

  def reshape(self, *shape):
    return PanelWeight(self.value.reshape(*shape), self.panels)

  def tree_flatten(self):
    return (self.value, self.panels), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)


def array(w):
  """The plain array of a weight that may carry panels."""
  return w.value if isinstance(w, PanelWeight) else w


def on_panels(x, w) -> bool:
  """x [..., K] times w runs on the panel kernel: w carries panels, x has few rows, x is float32."""
  return (isinstance(w, PanelWeight) and math.prod(x.shape[:-1]) <= cpu_panel_matmul.FEW_ROWS
          and x.dtype == jnp.float32)


def matmul(x, w):
  """x [..., K] @ w [K, N] -> [..., N]: on the panel kernel when `on_panels(x, w)`, else XLA's product."""
  return _panel_matmul(x, w.value, w.panels) if on_panels(x, w) else x @ array(w)


def tied_matmul(h, embed):
  """h [M, E] @ embed [V, E]^T -> [M, V] on the panel kernel (embed carries the panels of embed^T)."""
  return _panel_matmul(h, embed.value.T, embed.panels)


@jax.custom_vjp
def _panel_matmul(x, w, panels):
  return cpu_panel_matmul.product(x, panels, w.shape[1])


def _panel_matmul_fwd(x, w, panels):
  return _panel_matmul(x, w, panels), (x, w, panels)


def _panel_matmul_bwd(res, g):  # g [..., N]: the gradients of x @ w, by XLA (the panels get none)
  x, w, panels = res
  dw = x.reshape(-1, x.shape[-1]).T @ g.reshape(-1, g.shape[-1])
  return g @ w.T, dw, jnp.zeros_like(panels)


_panel_matmul.defvjp(_panel_matmul_fwd, _panel_matmul_bwd)


def usable(model, rows: int) -> bool:
  """Decode of `rows` rows by this model runs on the panel kernel: float32 weights of MIN_MODEL_BYTES to
  MAX_MODEL_BYTES on one CPU device (or on each device's own rows inside a shard_map), few rows, the
  kernel built."""
  if rows > cpu_panel_matmul.FEW_ROWS or model.platform != "cpu" or jax.default_backend() != "cpu":
    return False
  if any(x.dtype != jnp.float32 for x in jax.tree.leaves(nnx.state(model, nnx.Param))):
    return False
  if not MIN_MODEL_BYTES <= model.weight_bytes() <= MAX_MODEL_BYTES:
    return False
  mesh = jax.sharding.get_abstract_mesh()
  one_device = jax.device_count() == 1 if mesh.empty else set(mesh.manual_axes) == set(mesh.axis_names)
  return one_device and cpu_panel_matmul.available()


# Projection weights that get panels: name -> how many leading dims the product contracts (o [H, D, E]
# contracts H x D); a tied model's embedding [V, E] gets the panels of its transpose, the output projection.
PANEL_PARAMS = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1, "lm_head": 1}


def for_decode(model, rows: int):
  """The model with its projection weights (PANEL_PARAMS, and a tied embedding) carrying panels when
  `usable(model, rows)`; else the model itself. Built from the model's state (no module is mutated), so
  it can be made inside any trace, e.g. a memory update's scan step."""
  if not usable(model, rows):
    return model
  graphdef, state = nnx.split(model)
  tied = model.lm_head is None

  def with_panels(path, w):
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    name = names[-1] if names else None
    if name == "embed" and tied:
      return PanelWeight(w, cpu_panel_matmul.pack(w.T))
    if name in PANEL_PARAMS:
      return PanelWeight(w, cpu_panel_matmul.pack(w.reshape(math.prod(w.shape[:PANEL_PARAMS[name]]), -1)))
    return w

  return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(with_panels, state))
