"""What a compiled XLA program does per device, read from its optimised HLO text, with every
loop body counted as often as the loop runs (XLA's `cost_analysis` counts a body once).

Counted: matmul FLOPs (`dot`, `convolution`), bytes read and written by the top-level operations
(fusions count their operands and outputs, not their insides), and collectives (all-gather,
all-reduce, reduce-scatter, all-to-all, collective-permute: count and bytes). A loop's trip count
is read from its condition (`i < N`, N a constant, i from 0: how JAX lowers scan, fori_loop and
the decode loop's token cap); one that cannot be read counts once and is listed as unknown.
"""

from __future__ import annotations

import dataclasses
import math
import re

DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
               "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
               "c128": 16}
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
# Operations that move no data of their own (their callees are counted, or they only rename).
_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional",
               "call", "after-all", "partition-id", "replica-id", "iota", "opt-barrier", "domain",
               "add-dependency", "custom-call-done"}

_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*\((.*)\)\s*->\s*(.*)\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s+([a-z][a-z0-9\-]*)\((.*)$")


def shape_bytes(shape: str) -> int:
  """Bytes of every array in an HLO shape string (a tuple sums its members; layouts ignored)."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    if dtype in DTYPE_BYTES:
      total += DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return total


def _largest_array(shape: str) -> int:
  """Bytes of the largest array in an HLO shape string (a tuple's largest member)."""
  sizes = [DTYPE_BYTES.get(d, 0) * math.prod(int(x) for x in dims.split(",") if x) for d, dims in _ARRAY.findall(shape)]
  return max(sizes, default=0)


def _dims(shape: str) -> list[int]:
  m = _ARRAY.search(shape)
  return [int(d) for d in m.group(2).split(",") if d] if m else []


@dataclasses.dataclass
class Instr:
  name: str
  shape: str
  opcode: str
  operands: list[str]
  attrs: str
  args: str  # the text inside the parentheses (a constant's value)


@dataclasses.dataclass
class Computation:
  name: str
  instrs: list[Instr]
  shapes: dict[str, str]  # instruction / parameter name -> shape
  fused: bool = False  # called by a fusion: its ops are inside one kernel, no memory traffic


def _split_operands(text: str) -> tuple[list[str], str, str]:
  """'%a, %b), attr=...' after the opening paren -> (['a', 'b'], 'attr=...', '%a, %b')."""
  depth, i = 1, 0
  while i < len(text) and depth:
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    i += 1
  inner, attrs = text[:i - 1], text[i:]
  return re.findall(r"%([\w.\-]+)", inner), attrs, inner


def parse_module(text: str) -> tuple[dict[str, Computation], str]:
  """Computations of an HLO module text by name, and the entry computation's name."""
  comps, entry, current = {}, None, None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = Computation(header.group(2), [], {})
      for pname, pshape in re.findall(r"([\w.\-]+):\s*([^,()]+(?:\([^)]*\))?)", header.group(3)):
        current.shapes[pname] = pshape
      comps[current.name] = current
      if header.group(1):
        entry = current.name
      continue
    if current is None:
      continue
    m = _INSTR.match(line)
    if m:
      operands, attrs, args = _split_operands(m.group(5))
      ins = Instr(m.group(2), m.group(3), m.group(4), operands, attrs, args)
      current.instrs.append(ins)
      current.shapes[ins.name] = ins.shape
  for comp in comps.values():
    for ins in comp.instrs:
      if ins.opcode == "fusion":
        for callee in _callees(ins):
          if callee in comps:
            comps[callee].fused = True
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  return comps, entry


def _attr(ins: Instr, key: str) -> str | None:
  m = re.search(rf"\b{key}=%?([\w.\-]+)", ins.attrs)
  return m.group(1) if m else None


def _callees(ins: Instr) -> list[str]:
  """Computations an instruction runs (reduction lambdas of `to_apply` are per element: left out)."""
  names = re.findall(r"\b(?:calls|body|condition)=%([\w.\-]+)", ins.attrs)
  m = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
  if m:
    names += re.findall(r"%([\w.\-]+)", m.group(1))
  for key in ("true_computation", "false_computation"):
    if (c := _attr(ins, key)):
      names.append(c)
  return names


def matmul_flops(ins: Instr, shapes: dict[str, str]) -> int:
  """2 x output elements x contracted size of a dot or convolution (0 for anything else)."""
  out = math.prod(_dims(ins.shape))
  if ins.opcode == "dot":
    m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins.attrs)
    lhs = _dims(shapes.get(ins.operands[0], ""))
    k = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m and lhs else 1
    return 2 * out * k
  if ins.opcode == "convolution":
    m = re.search(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->", ins.attrs)
    lhs = _dims(shapes.get(ins.operands[0], ""))
    rhs = _dims(shapes.get(ins.operands[1], "")) if len(ins.operands) > 1 else []
    if not m or len(m.group(2)) != len(rhs) or len(m.group(1)) != len(lhs):
      return 0
    k = math.prod(size for label, size in zip(m.group(2), rhs) if label == "i")  # input features
    window = re.search(r"window=\{size=([0-9x]+)([^}]*)\}", ins.attrs)
    if window:  # real input taps per output: at most the window over an lhs dilated by d (holes), and
      # at most the lhs's own extent (TPU writes batched matmuls as windows over padded or dilated dims)
      sizes = [int(x) for x in window.group(1).split("x")]
      dil = re.search(r"lhs_dilate=([0-9x]+)", window.group(2))
      dils = [int(x) for x in dil.group(1).split("x")] if dil else [1] * len(sizes)
      extent = {label: size for label, size in zip(m.group(1), lhs) if label.isdigit()}
      k *= math.prod(min(-(-w // d), extent.get(str(i), w)) for i, (w, d) in enumerate(zip(sizes, dils)))
    groups = re.search(r"feature_group_count=(\d+)", ins.attrs)
    return 2 * out * k // (int(groups.group(1)) if groups else 1)
  return 0


def _collective_kind(opcode: str) -> str | None:
  base = opcode[:-6] if opcode.endswith("-start") else opcode
  return base if base in COLLECTIVES else None


@dataclasses.dataclass
class Totals:
  flops: float = 0.0
  bytes_accessed: float = 0.0
  collectives: dict = dataclasses.field(default_factory=dict)  # kind -> [count, bytes]

  def add(self, other: "Totals", times: float = 1.0):
    self.flops += other.flops * times
    self.bytes_accessed += other.bytes_accessed * times
    for kind, (n, b) in other.collectives.items():
      c = self.collectives.setdefault(kind, [0.0, 0.0])
      c[0] += n * times
      c[1] += b * times

  @property
  def collective_bytes(self) -> float:
    return sum(b for _, b in self.collectives.values())


@dataclasses.dataclass
class Loop:
  """One while loop: its trip count (None: unknown, counted once) and one iteration's totals."""
  name: str
  trip_count: int | None
  per_iteration: Totals
  innermost: bool


def _lt_bound(comp: Computation, comps: dict[str, Computation]) -> int | None:
  """N of a `compare(i, N), direction=LT` in a loop condition, N a constant of the condition; the
  compare may sit inside a fusion whose second operand is N (the CPU compiler wraps it)."""
  values = {}
  for ins in comp.instrs:
    if ins.opcode == "constant":
      try:
        values[ins.name] = int(ins.args.strip())
      except ValueError:
        pass
  for ins in comp.instrs:
    if len(ins.operands) != 2 or ins.operands[1] not in values:
      continue
    if ins.opcode == "compare" and "direction=LT" in ins.attrs:
      return values[ins.operands[1]]
    if ins.opcode == "fusion":
      callee = comps.get(next(iter(_callees(ins)), ""))
      if callee and any(i.opcode == "compare" and "direction=LT" in i.attrs for i in callee.instrs):
        return values[ins.operands[1]]
  return None


def _induction_step(cond: Computation, body: Computation) -> int:
  """How much a loop's counter grows per iteration: the counter is the tuple element the condition
  compares, and the body's root tuple sets it to `add(counter, c)` (XLA's own loops, e.g. a collective
  matmul unrolled by 2, step by more than 1). 1 when that cannot be read."""
  compare = next((i for i in cond.instrs if i.opcode in ("compare", "fusion") and len(i.operands) == 2), None)
  gte = next((i for i in cond.instrs if compare and i.name == compare.operands[0] and i.opcode == "get-tuple-element"),
             None)
  index = re.search(r"index=(\d+)", gte.attrs) if gte else None
  root = body.instrs[-1] if body.instrs else None
  if not index or root is None or root.opcode != "tuple" or int(index.group(1)) >= len(root.operands):
    return 1
  by_name = {i.name: i for i in body.instrs}
  update = by_name.get(root.operands[int(index.group(1))])
  if update is None or update.opcode != "add":
    return 1
  for o in update.operands:
    c = by_name.get(o)
    if c is not None and c.opcode == "constant" and c.args.strip().lstrip("-").isdigit() and int(c.args) > 0:
      return int(c.args)
  return 1


def trip_count(loop: Instr, comps: dict[str, Computation]) -> int | None:
  """Iterations of a while loop: XLA's known_trip_count when it printed one, else N of its condition
  `i < N` over the counter's step (JAX loops count from 0 by 1; the decode loop's `step <
  max_new_tokens` is its worst case)."""
  m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attrs)
  if m:
    return int(m.group(1))
  cond, body = comps.get(_attr(loop, "condition") or ""), comps.get(_attr(loop, "body") or "")
  n = _lt_bound(cond, comps) if cond else None
  if n is None or body is None:
    return n
  return -(-n // _induction_step(cond, body))


class ProgramStats:
  """Per-device totals of a compiled module with loop trip counts multiplied in."""

  def __init__(self, hlo_text: str):
    self.comps, self.entry = parse_module(hlo_text)
    self.loops: list[Loop] = []
    self._memo: dict[str, Totals] = {}
    self.total = self._visit(self.entry)

  def _visit(self, name: str) -> Totals:
    if name in self._memo:
      return self._memo[name]
    comp = self.comps[name]
    t = Totals()
    for ins in comp.instrs:
      t.flops += matmul_flops(ins, comp.shapes)
      kind = _collective_kind(ins.opcode)
      if kind:
        # the larger of what goes in and what comes out (a reduce-scatter's input, an all-gather's
        # output; an async -start's shape is a tuple of both: its largest array counts)
        size = max([_largest_array(ins.shape)] + [shape_bytes(comp.shapes.get(o, "")) for o in ins.operands])
        c = t.collectives.setdefault(kind, [0.0, 0.0])
        c[0] += 1
        c[1] += size
      if not comp.fused and ins.opcode not in _NO_TRAFFIC and not ins.opcode.endswith("-done"):
        t.bytes_accessed += self._traffic(ins, comp)
      if ins.opcode == "while":
        body = _attr(ins, "body")
        inner = self._visit(body)
        n = trip_count(ins, self.comps)
        nested = any(i.opcode == "while" for i in self._reachable(body))
        self.loops.append(Loop(ins.name, n, inner, innermost=not nested))
        t.add(inner, n or 1)
      elif ins.opcode == "conditional":  # the costliest branch (the rollout's "some row is active")
        branches = [self._visit(c) for c in _callees(ins) if c in self.comps]
        if branches:
          t.add(max(branches, key=lambda b: (b.flops, b.bytes_accessed)))
      else:
        for callee in _callees(ins):
          if callee in self.comps:
            t.add(self._visit(callee))
    self._memo[name] = t
    return t

  def _traffic(self, ins: Instr, comp: Computation) -> int:
    """Bytes an operation reads and writes. An in-place dynamic-update-slice (alone or as a fusion's
    root: a KV-cache write) moves its update, not the whole buffer it updates."""
    operand = [shape_bytes(comp.shapes.get(o, "")) for o in ins.operands]
    out = shape_bytes(ins.shape)
    if ins.opcode == "dynamic-update-slice":
      return 2 * (operand[1] if len(operand) > 1 else 0)
    if ins.opcode in ("dynamic-slice", "gather"):  # reads the slice / rows it outputs, not its source
      return 2 * out + sum(operand[1:])
    if ins.opcode.startswith("copy-start"):  # an asynchronous copy reads its source once
      return operand[0] if operand else out
    if ins.opcode == "fusion":
      callee = next((c for c in _callees(ins) if c in self.comps), None)
      if callee is not None:
        for buffer_index, update_bytes in self._in_place_updates(callee):
          if buffer_index < len(operand):
            out -= min(out, operand[buffer_index]) - update_bytes
            operand[buffer_index] = 0
        for source_index, read_bytes in self._sliced_reads(callee):
          if source_index < len(operand):
            operand[source_index] = min(operand[source_index], read_bytes)
    return out + sum(operand)

  def _in_place_updates(self, name: str) -> list[tuple[int, int]]:
    """(parameter index of the updated buffer, update bytes) of each dynamic-update-slice in a fused
    computation whose buffer is one of its parameters."""
    comp = self.comps[name]
    params = {i.name: int(i.args.strip()) for i in comp.instrs if i.opcode == "parameter" and i.args.strip().isdigit()}
    out = []
    for ins in comp.instrs:
      if ins.opcode == "dynamic-update-slice" and len(ins.operands) > 1 and ins.operands[0] in params:
        out.append((params[ins.operands[0]], shape_bytes(comp.shapes.get(ins.operands[1], ""))))
    return out

  def _sliced_reads(self, name: str) -> list[tuple[int, int]]:
    """(parameter index, bytes read) of each parameter a fused computation only gathers or slices from
    (an embedding lookup reads its rows, not the table)."""
    comp = self.comps[name]
    params = {i.name: int(i.args.strip()) for i in comp.instrs if i.opcode == "parameter" and i.args.strip().isdigit()}
    users: dict[str, list[Instr]] = {}
    for ins in comp.instrs:
      for o in ins.operands:
        users.setdefault(o, []).append(ins)
    out = []
    for pname, index in params.items():
      uses = users.get(pname, [])
      if uses and all(u.opcode in ("gather", "dynamic-slice") and u.operands[0] == pname for u in uses):
        out.append((index, sum(shape_bytes(u.shape) for u in uses)))
    return out

  def _reachable(self, name: str, seen=None) -> list[Instr]:
    seen = set() if seen is None else seen
    if name in seen or name not in self.comps:
      return []
    seen.add(name)
    out = []
    for ins in self.comps[name].instrs:
      out.append(ins)
      for callee in _callees(ins):
        out += self._reachable(callee, seen)
    return out

  def max_loop_collective_bytes(self, innermost_only: bool = True) -> float:
    """The largest collective bytes one iteration of a (by default innermost) loop moves."""
    loops = [l for l in self.loops if l.innermost or not innermost_only]
    return max((l.per_iteration.collective_bytes for l in loops), default=0.0)

  def custom_calls(self) -> dict[str, int]:
    """custom_call_target -> how many custom calls the module has (tpu_custom_call: a Mosaic kernel)."""
    out: dict[str, int] = {}
    for comp in self.comps.values():
      for ins in comp.instrs:
        if ins.opcode == "custom-call":
          m = re.search(r'custom_call_target="([^"]+)"', ins.attrs)
          key = m.group(1) if m else "?"
          out[key] = out.get(key, 0) + 1
    return out

  def unknown_trip_counts(self) -> int:
    return sum(l.trip_count is None for l in self.loops)
