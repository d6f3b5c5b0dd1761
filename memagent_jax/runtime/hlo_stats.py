"""What a compiled XLA program does per device, read from its optimised HLO text, with every
loop body counted as often as the loop runs (XLA's `cost_analysis` counts a body once).

Counted: matmul FLOPs (`dot`, `convolution`, and the splash attention kernels' from their shapes:
`custom_call_flops`), bytes read and written by the top-level operations (fusions count their
operands and outputs, not their insides), and collectives (all-gather, all-reduce, reduce-scatter,
all-to-all, collective-permute: count and the bytes each chip sends over ICI, `collective_bytes`).
A loop's trip count is read from its condition (`i < N`, N a constant, i from 0: how JAX lowers
scan, fori_loop and the decode loop's token cap); one that cannot be read counts once and is listed
as unknown. A custom call whose FLOPs cannot be read is listed as uncounted, by target.
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
               "add-dependency", "custom-call-done", "async-start", "async-update", "async-done"}
# Custom calls that only annotate or move data: no matmul FLOPs to count (any other is listed as uncounted).
# The TPU compiler's own (seen in its optimised HLO of the rollout and update): gather / scatter index
# hints, layout rewrites, and the start / done markers of collectives it made asynchronous (no arithmetic:
# a start's operand is the collective op itself, e.g. `custom-call(%all-gather.255)`, counted as one);
# SliceId: a multi-slice program reads its slice's index (a scalar).
NO_FLOP_TARGETS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost", "MoveToDevice",
                   "AllocateBuffer", "LayoutConstraint", "annotate_device_placement", "PadToStatic", "SliceToDynamic",
                   "X64Combine", "X64SplitLow", "X64SplitHigh", "AssumeGatherIndicesInBound",
                   "GatherScatterIndicesBitpacked", "ZeroCrop", "ConcatBitcast", "AsyncCollectiveStart",
                   "AsyncCollectiveDone", "SliceId"}

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
    elif line.strip() == "}":
      current = None
    elif current.instrs:  # an attribute printed over several lines (a custom call's kernel_metadata)
      current.instrs[-1].attrs += "\n" + line
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
  """Computations an instruction runs (reduction lambdas of `to_apply` are per element: left out, but a
  call's to_apply is its body: the TPU7x compiler offloads collectives to its SparseCores as asynchronous
  `call-start(), async_execution_thread="sparsecore", to_apply=%body` .. call-update .. call-done)."""
  names = re.findall(r"\b(?:calls|body|condition)=%([\w.\-]+)", ins.attrs)
  if ins.opcode in ("call", "call-start") and (body := _attr(ins, "to_apply")):
    names.append(body)
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


_SPLASH = re.compile(r"\bsplash_(?:mha|mqa)_(fwd|dq|dkv)")
_FLOAT = re.compile(r"^\(?\s*(bf16|f16|f32|f64|f8\w*)\[")


def causal_pairs(tq: int, tk: int) -> int:
  """(query, key) pairs a causal mask keeps, query i seeing keys 0..i: T(T+1)/2 when tq == tk == T."""
  rows = min(tq, tk)
  return rows * (rows + 1) // 2 + (tq - rows) * tk


def custom_call_flops(ins: Instr, shapes: dict[str, str], causal: bool = True) -> float | None:
  """Matmul FLOPs of a splash attention kernel (a Mosaic `tpu_custom_call`), None for a custom call
  whose FLOPs are unknown. The phase is the pallas kernel's name `splash_{mha,mqa}_{fwd,dq,dkv}...`,
  which XLA keeps as the instruction's name and in its op_name. q, k, v are the first three float
  operands (q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv]; the leading dims are batch and heads):
  each matmul is 2 x prod(q dims but D) x Tk x (D or Dv) FLOPs, fwd 2 of them (S = QK^T, O = PV),
  dq 3 (S, dP = dO V^T, dQ = dS K), dkv 4 (S, dP, dV = P^T dO, dK = dS^T Q) and 5 when it writes dq too
  (the fused backward: 3 outputs), so fwd = 4 B H Tq Tk D for Dv = D. `causal`: only the kept pairs
  count, `causal_pairs(Tq, Tk) / (Tq Tk)` ((T+1)/(2T) for Tq == Tk; the only mask this project builds,
  which the HLO does not print; the kernel also runs the masked half of diagonal blocks)."""
  m = _SPLASH.search(ins.name) or _SPLASH.search(ins.attrs)
  floats = [_dims(shapes.get(o, "")) for o in ins.operands if _FLOAT.match(shapes.get(o, ""))]
  if not m or len(floats) < 3 or min(len(f) for f in floats[:3]) < 2:
    return None
  q, k, v = floats[:3]
  tq, tk, d, dv = q[-2], k[-2], q[-1], v[-1]
  widths = {"fwd": d + dv, "dq": 2 * d + dv, "dkv": 2 * d + 2 * dv}[m.group(1)]
  if m.group(1) == "dkv" and len(_ARRAY.findall(ins.shape)) >= 3:
    widths += d
  pairs = causal_pairs(tq, tk) if causal else tq * tk
  return 2.0 * math.prod(q[:-2]) * pairs * widths


def _collective_kind(opcode: str) -> str | None:
  base = opcode[:-6] if opcode.endswith("-start") else opcode
  return base if base in COLLECTIVES else None


def group_size(ins: Instr, num_devices: int) -> int:
  """Devices in each replica group of a collective, in the three forms XLA prints:
  `{{0,1,2,3},{4,5,6,7}}` (a list), `[2,4]<=[8]` (iota: 2 groups of 4; a `T(..)` transpose changes
  which devices, not how many) and `mesh['data'=2,'fsdp'=4] {'fsdp'}` (the TPU compiler's: the
  product of the named axes' sizes). No groups, `{}` or a form not read: all `num_devices`."""
  m = re.search(r"replica_groups=(\S.*)", ins.attrs)
  text = m.group(1) if m else ""
  if (lst := re.match(r"\{\{([0-9,]*)\}", text)):
    return len([d for d in lst.group(1).split(",") if d])
  if (iota := re.match(r"\[(\d+),(\d+)\]<=", text)):
    return int(iota.group(2))
  if (mesh := re.match(r"mesh\[([^\]]*)\]\s*\{([^}]*)\}", text)):
    sizes = dict(re.findall(r"'([^']+)'=(\d+)", mesh.group(1)))
    axes = re.findall(r"'([^']+)'", mesh.group(2))
    if axes and all(a in sizes for a in axes):
      return math.prod(int(sizes[a]) for a in axes)
  return num_devices


def collective_bytes(ins: Instr, shapes: dict[str, str], num_devices: int) -> float:
  """Bytes one chip sends over ICI for a collective with a ring over its group of n devices, summed over
  every operand of a combined (variadic) collective, from the operands (an async -start's tuple shape,
  input and output together, is not read): all-gather (n-1)/n x output = (n-1) x input; reduce-scatter
  (n-1)/n x input; all-reduce 2(n-1)/n x input (a reduce-scatter then an all-gather); all-to-all (n-1)/n
  x input; collective-permute its buffer once (0 when no pairs)."""
  kind = _collective_kind(ins.opcode)
  operands = ins.operands[:1] if "slice_sizes=" in ins.attrs else ins.operands  # in-place permute: buffer only
  size = sum(shape_bytes(shapes.get(o, "")) for o in operands)
  if kind == "collective-permute":
    return 0.0 if re.search(r"source_target_pairs=\{\}", ins.attrs) else float(size)
  n = group_size(ins, num_devices)
  if not size and not ins.opcode.endswith("-start"):  # operands not declared: from the output
    out = shape_bytes(ins.shape)
    size = out / n if kind == "all-gather" else out * n if kind == "reduce-scatter" else out
  if n <= 1:
    return 0.0
  return {"all-gather": n - 1, "all-reduce": 2 * (n - 1) / n}.get(kind, (n - 1) / n) * size


@dataclasses.dataclass
class Totals:
  flops: float = 0.0
  bytes_accessed: float = 0.0
  collectives: dict = dataclasses.field(default_factory=dict)  # kind -> [count, bytes sent per chip]
  uncounted: dict = dataclasses.field(default_factory=dict)  # custom_call_target -> calls of no known FLOPs

  def add(self, other: "Totals", times: float = 1.0):
    self.flops += other.flops * times
    self.bytes_accessed += other.bytes_accessed * times
    for kind, (n, b) in other.collectives.items():
      c = self.collectives.setdefault(kind, [0.0, 0.0])
      c[0] += n * times
      c[1] += b * times
    for target, n in other.uncounted.items():
      self.uncounted[target] = self.uncounted.get(target, 0.0) + n * times

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
  """Per-device totals of a compiled module with loop trip counts multiplied in. splash_causal: count
  splash kernels' FLOPs under a causal mask (see `custom_call_flops`)."""

  def __init__(self, hlo_text: str, *, splash_causal: bool = True):
    self.comps, self.entry = parse_module(hlo_text)
    counts = re.findall(r"\b(?:num_partitions|replica_count)=(\d+)", hlo_text.split("\n", 1)[0])
    self.num_devices = math.prod(int(c) for c in counts)  # what a collective naming no groups spans
    self.splash_causal = splash_causal
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
      if kind:  # an async pair counts at its -start (a -done is no collective kind)
        c = t.collectives.setdefault(kind, [0.0, 0.0])
        c[0] += 1
        c[1] += collective_bytes(ins, comp.shapes, self.num_devices)
      if ins.opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]+)"', ins.attrs)
        target = target.group(1) if target else "?"
        flops = custom_call_flops(ins, comp.shapes, self.splash_causal)
        if flops is not None:
          t.flops += flops
        elif target not in NO_FLOP_TARGETS:
          t.uncounted[target] = t.uncounted.get(target, 0.0) + 1
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
      elif ins.opcode not in ("async-update", "async-done"):  # an async op counts at its start
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
    if ins.opcode == "slice-start":  # a sliced prefetch reads its slice once; its tuple also names the source
      arrays = _ARRAY.findall(ins.shape)  # (source..., slice, context): the slice follows the operands
      return shape_bytes("{}[{}]".format(*arrays[len(ins.operands)])) if len(arrays) > len(ins.operands) else out
    if ins.opcode == "custom-call" and 'custom_call_target="ConcatBitcast"' in ins.attrs:
      return 0  # the prefetched slices side by side in one buffer: nothing moves
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
    """How many while loops had no readable trip count (each counted as running once)."""
    return sum(l.trip_count is None for l in self.loops)

  def uncounted_custom_calls(self) -> dict[str, float]:
    """custom_call_target -> calls whose FLOPs are unknown and not in the totals, per run (loop trip
    counts multiplied in; no entry for targets that only annotate or move data, NO_FLOP_TARGETS)."""
    return dict(sorted(self.total.uncounted.items()))
