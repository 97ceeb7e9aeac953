"""FLOPs and memory traffic of a compiled XLA program, read from its HLO text, with loops counted.

XLA's `compiled.cost_analysis()` counts the body of a `while` loop once, whatever its trip count (checked
on the TPU compiler of jax 0.10.2: a 10-step `lax.scan` of a matmul reports the FLOPs of one step). The
biLM's train step is mostly loops (the LSTM's time steps, forward and backward; the char CNN's token
blocks), so its reported FLOPs and bytes are far from what one step does. This module reads the
optimised HLO (`compiled.as_text()`) and counts every instruction as many times as it runs:

- a `while` body times its trip count (`known_trip_count` in the backend config, else the constant
  its condition compares the counter with, counting from 0), nested loops multiplied;
- FLOPs: 2 per multiply-add of every `dot` and `convolution`, inside fusions too (elementwise work is
  not counted, as for MFU);
- bytes: what each top-level instruction reads and writes, the way XLA's cost analysis counts a fusion:
  its operands and results, except that an operand only sliced (`slice`, `dynamic-slice`, `gather`)
  inside the fusion counts the slices, an operand updated in place (`dynamic-update-slice`, `scatter`)
  counts only the update, and so does such a result. Bookkeeping (parameters, tuples, bitcasts,
  constants, asynchronous copy starts/dones, buffer allocations) moves nothing by itself.

Every byte counted is assumed to cross HBM: values the compiler keeps in on-chip memory (`S(1)` in a
TPU layout) are counted too, so the figure is an upper bound of HBM traffic, the same convention as
XLA's own "bytes accessed". Collectives (all-reduce, all-gather, reduce-scatter, all-to-all,
collective-permute) are also summed apart, by the bytes of their results, with whether they run
inside a loop. A collective the TPU compiler overlaps with other work is split into fusions sharing its
buffers (an "AsyncCollectiveStart" custom-call, the fusions of the work it overlaps, which carry the
buffers and a copy of the collective op through every loop trip, and a done); it runs once, and is
counted once, at its start (its input read, its result written).

Three more readings of the same program, beside those totals (`times`):

- scatter reads: an in-place scatter that combines (a scatter-add: its `to_apply` is not "take the
  update") reads each row it updates before writing it back; the bytes above count only the write, so
  `scatter_read_bytes` adds the read half of that read-modify-write (the update's size, for each such
  scatter whose result is in HBM);
- the serial roofline: each kernel (top-level instruction) on its own takes the larger of its FLOP
  time and its HBM time (scatter reads included), and kernels do not overlap: the sum, loops counted;
- the compiler's estimate: the TPU compiler writes its cost model's `"estimated_cycles"` into the
  backend config of most kernels (fusions, copies, reductions: in `window_config`); each kernel's cycles
  times its loop trips, at the chip's clock, plus, for kernels it gives no estimate for (scatters and
  gathers of its custom fusions, asynchronous copies, collectives), their serial roofline time.

`analyse(text)` returns a `Cost` with totals and every top-level instruction's share, each attributed
to the innermost frames of the Python source that made it (the HLO's stack-frame tables).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re

import numpy as np

DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
    "c64": 8,
    "c128": 16,
    "token": 0,
}
FREE_OPS = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "after-all",
    "partition-id",
    "replica-id",
    "copy-start",
    "copy-done",
    "opt-barrier",
    "add-dependency",
    "iota",
}
CALLING_OPS = {"while", "call", "conditional", "async-start", "async-done", "async-update"}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
SLICING = {"slice", "dynamic-slice"}
NOT_ELEMENTWISE = {
    "dot",
    "convolution",
    "reduce",
    "reduce-window",
    "select-and-scatter",
    "transpose",
    "slice",
    "dynamic-slice",
    "dynamic-update-slice",
    "gather",
    "scatter",
    "sort",
    "concatenate",
    "pad",
    "reverse",
    "fusion",
    "while",
    "call",
    "custom-call",
    "all-reduce",
    "all-gather",
}

_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s*->\s*.*\{\s*$")


@dataclasses.dataclass
class Instr:
    name: str
    shape: str  # the result type as written (an array or a tuple)
    opcode: str
    operands: list[str]
    attrs: str
    root: bool = False
    inner: str = ""  # the text between the opcode's parentheses (a constant's value, a parameter's index)


@dataclasses.dataclass
class Item:
    """One top-level instruction's totals over a run of the program."""

    name: str
    opcode: str
    op_name: str
    where: str
    count: int  # times it runs (loop trip counts multiplied)
    flops: float
    mxu_flops: float  # flops x bfloat16 passes (float32 at HIGHEST: 6)
    bytes: float  # every operand and result, wherever it lives (XLA's convention)
    hbm_bytes: float  # only operands and results in HBM, plus copies between HBM and on-chip memory
    collective_bytes: float
    in_loop: bool
    scatter_read_bytes: float = 0.0  # the read half of in-place combining scatters' updates, in HBM
    cycles: float | None = None  # the compiler's estimated_cycles x count; None: no estimate given
    collective: str = ""  # the kind of collective a fusion starts (TPU async collective fusions)
    # The GPU compiler's estimates x count (`reification_cost`), seconds: {cost model: (exec, compute,
    # memory)}, "" its own (reported first), "sol" speed of light, ...; empty: none given.
    estimates: dict[str, tuple[float, float, float]] = dataclasses.field(default_factory=dict)

    @property
    def estimate_s(self) -> float | None:
        """The GPU compiler's own time for this kernel (its first, unnamed model), or None. Its "sol" (speed
        of light), the only figure it gives a cuBLAS call, prices a bfloat16 GEMM at ~5-12 TFLOP/s on an
        H100 (bench/RESULTS_gpu_compile.md), so it is summed apart and not used here."""
        own = self.estimates.get("")
        return None if own is None else own[0]

    @property
    def estimated(self) -> bool:
        """Whether a compiler gave this kernel an estimate (TPU cycles or GPU time)."""
        return self.cycles is not None or self.estimate_s is not None

    def seconds(self, peak_flops: float, hbm_bandwidth: float, clock_hz: float | None) -> dict[str, float]:
        """This kernel's FLOP, HBM (scatter reads included), serial (the larger) and estimated times."""
        flop_s = self.mxu_flops / peak_flops
        hbm_s = (self.hbm_bytes + self.scatter_read_bytes) / hbm_bandwidth
        serial_s = max(flop_s, hbm_s)
        estimated = self.cycles / clock_hz if self.cycles is not None and clock_hz else self.estimate_s
        return {
            "flop_s": flop_s,
            "hbm_s": hbm_s,
            "serial_s": serial_s,
            "estimated_s": serial_s if estimated is None else estimated,
        }


@dataclasses.dataclass
class Cost:
    flops: float
    mxu_flops: float
    bytes: float
    hbm_bytes: float
    collective_bytes: float
    collective_bytes_in_loops: float
    items: list[Item]
    loops: list[tuple[str, int, str]]  # (while instruction, trip count, op_name)

    @property
    def scatter_read_bytes(self) -> float:
        return sum(i.scatter_read_bytes for i in self.items)

    def collectives_by_kind(self) -> dict[str, float]:
        """Collective bytes per kind (all-reduce, all-gather, ...), async starts under their kind."""
        kinds = collections.Counter()
        for i in self.items:
            if i.collective_bytes:
                kinds[i.collective or i.opcode.removesuffix("-start")] += i.collective_bytes
        return dict(kinds)

    def times(self, peak_flops: float, hbm_bandwidth: float, clock_hz: float | None) -> dict[str, float]:
        """Seconds per run of the program on a chip of these figures (see the module docstring):
        flop_s, hbm_s (scatter reads counted), serial_s (sum of per-kernel maxima), estimated_s (the
        compiler's cycles at clock_hz, or the GPU compiler's times, plus the serial time of kernels without
        an estimate; None without a TPU clock or GPU times), of which unestimated_s, and estimated_kernels
        (kernels with an estimate)."""
        per = [i.seconds(peak_flops, hbm_bandwidth, clock_hz) for i in self.items]
        unestimated = sum(t["serial_s"] for t, i in zip(per, self.items) if not i.estimated)
        timed = clock_hz or any(i.estimates for i in self.items)
        return {
            "flop_s": self.mxu_flops / peak_flops,
            "hbm_s": (self.hbm_bytes + self.scatter_read_bytes) / hbm_bandwidth,
            "serial_s": sum(t["serial_s"] for t in per),
            "estimated_s": sum(t["estimated_s"] for t in per) if timed else None,
            "unestimated_s": unestimated,
            "estimated_kernels": sum(i.estimated for i in self.items),
        }

    def gpu_estimates(self) -> dict[str, dict[str, float]]:
        """The GPU compiler's estimates summed per cost model ("" its own, "sol", ...): {model: {"exec_s",
        "compute_s", "memory_s", "kernels"}}, over the kernels that model priced (loops counted)."""
        sums: dict[str, dict[str, float]] = {}
        for item in self.items:
            for model, times in item.estimates.items():
                row = sums.setdefault(model, dict.fromkeys(("exec_s", "compute_s", "memory_s", "kernels"), 0.0))
                for key, value in zip(("exec_s", "compute_s", "memory_s"), times):
                    row[key] += value
                row["kernels"] += 1
        return sums

    def by_kind(self, peak_flops: float, hbm_bandwidth: float, clock_hz: float | None) -> dict[str, dict[str, float]]:
        """The times of `Item.seconds` summed by kind of kernel (`kind`), each kind split into kernels that run
        inside a loop and outside: {"products, in loops": {"estimated_s", "flop_s", "hbm_s", "serial_s",
        "kernels"}, ...}, largest estimate first. The estimated seconds of all kinds add up to `times`'s."""
        totals: dict[str, dict[str, float]] = {}
        for item in self.items:
            key = f"{kind(item)}, {'in loops' if item.in_loop else 'outside loops'}"
            row = totals.setdefault(key, dict.fromkeys(("estimated_s", "flop_s", "hbm_s", "serial_s", "kernels"), 0.0))
            for name, value in item.seconds(peak_flops, hbm_bandwidth, clock_hz).items():
                row[name] += value or 0.0
            row["kernels"] += 1
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]["estimated_s"]))

    def top(self, n: int = 15, key: str = "bytes") -> list[Item]:
        return sorted(self.items, key=lambda i: -getattr(i, key))[:n]

    def top_by_time(self, n: int, peak_flops: float, hbm_bandwidth: float, clock_hz: float | None, key="estimated_s"):
        """The n kernels with the largest `key` time (estimated_s, serial_s, flop_s, hbm_s): [(item, times)]."""
        rows = [(i, i.seconds(peak_flops, hbm_bandwidth, clock_hz)) for i in self.items]
        return sorted(rows, key=lambda r: -r[1][key])[:n]

    def by_where(self, key: str = "bytes") -> list[tuple[str, float]]:
        totals = collections.Counter()
        for item in self.items:
            totals[item.where] += getattr(item, key)
        return totals.most_common()


# The kinds of kernel `Cost.by_kind` sums. The compiler's cost model prices them differently (measured on
# the bilm_large step, bench/RESULTS_tpu_compile.md, "What the goal needs"): a product near its FLOP time,
# elementwise work, copies, loads and stores by the elements they touch (several times their HBM time
# when the data is in on-chip memory), and the kernels it gives no estimate for at their HBM time here.
PRODUCTS = "products"  # a kernel with an estimate that runs matrix-unit FLOPs (a dot or convolution)
ELEMENTWISE = "elementwise, copies, reductions"  # a kernel with an estimate and no matrix-unit FLOPs
UNESTIMATED = "no estimate (HBM time)"  # gathers and scatters of custom fusions, async copies, collectives


def kind(item: Item) -> str:
    """Which of PRODUCTS, ELEMENTWISE and UNESTIMATED a kernel is."""
    if not item.estimated:
        return UNESTIMATED
    return PRODUCTS if item.mxu_flops > 0 else ELEMENTWISE


_ARRAY_LAYOUT = re.compile(
    r"\b(pred|token|[a-z]+\d+(?:e\d+m\d+(?:fn)?)?)\[([0-9,]*)\](\{[^{}]*(?:\([^()]*\)[^{}]*)*\})?"
)


def array_shapes(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every array in a (possibly tuple) HLO type: [(dtype, dims), ...]."""
    return [(dtype, dims) for dtype, dims, _ in _arrays(shape)]


def _arrays(shape: str) -> list[tuple[str, tuple[int, ...], str]]:
    out = []
    for dtype, dims, layout in _ARRAY_LAYOUT.findall(shape):
        out.append((dtype, tuple(int(d) for d in dims.split(",") if d), layout))
    return out


def _tiled_elements(dims: tuple[int, ...], layout: str) -> int:
    """Elements of an array as stored: a TPU layout `{minor_to_major:T(a,b)...}` pads the minor dims
    to whole tiles (a f32[2,16] in T(8,128) tiles occupies 8 x 128 elements)."""
    m = re.match(r"\{([0-9,]*)(?::(.*))?\}", layout or "")
    tile = re.search(r"T\(([0-9,]+)\)", m.group(2) or "") if m else None
    if not dims or not m or not tile:
        return math.prod(dims)
    order = [int(d) for d in m.group(1).split(",") if d]
    physical = [dims[d] for d in reversed(order)] if len(order) == len(dims) else list(dims)
    sizes = [int(t) for t in tile.group(1).split(",")]
    for k, t in enumerate(reversed(sizes)):
        if k < len(physical):
            physical[-1 - k] = -(-physical[-1 - k] // t) * t
    return math.prod(physical)


def nbytes(shape: str) -> float:
    """Bytes of every array in an HLO type, as stored (tile padding included)."""
    return sum(DTYPE_BYTES.get(dtype, 4) * _tiled_elements(dims, layout) for dtype, dims, layout in _arrays(shape))


def _tuple_elements(shape: str) -> list[str]:
    """The top-level elements of a tuple type '(a, (b, c), d)' -> ['a', '(b, c)', 'd']; an array -> [it]."""
    shape = shape.strip()
    if not shape.startswith("("):
        return [shape]
    out, depth, start = [], 0, 1
    for k, ch in enumerate(shape):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if (ch == "," and depth == 1) or depth == 0:
            out.append(re.sub(r"/\*.*?\*/", "", shape[start:k]).strip())
            start = k + 1
        if depth == 0:
            break
    return [e for e in out if e]


def _split_type(rest: str) -> tuple[str, str]:
    """'TYPE opcode(...)...' -> (TYPE, 'opcode(...)...'); TYPE may be a tuple with nested parentheses."""
    rest = rest.strip()
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[: i + 1], rest[i + 1 :].strip()
    head, _, tail = rest.partition(" ")
    return head, tail.strip()


def _call_parts(text: str) -> tuple[str, list[str], str, str]:
    """'opcode(%a, %b), attrs' -> (opcode, [a, b], attrs, 'text inside the parentheses')."""
    i = text.index("(")
    opcode = text[:i].strip()
    depth = 0
    for j in range(i, len(text)):
        depth += text[j] == "("
        depth -= text[j] == ")"
        if depth == 0:
            break
    inner, attrs = text[i + 1 : j], text[j + 1 :]
    operands = re.findall(r"%([\w.\-]+)", inner)
    return opcode, operands, attrs, inner


def parse(text: str) -> tuple[dict[str, list[Instr]], str, dict]:
    """HLO module text -> ({computation: [instructions]}, entry name, stack frame tables)."""
    computations: dict[str, list[Instr]] = {}
    entry = ""
    current = None
    tables = {"FileNames": {}, "FunctionNames": {}, "FileLocations": {}, "StackFrames": {}}
    table = None
    for line in text.splitlines():
        if current is None:
            if line.strip() in tables:
                table = tables[line.strip()]
                continue
            m = _COMP.match(line)
            if m:
                current = m.group(2)
                computations[current] = []
                entry = current if m.group(1) else entry
                table = None
                continue
            if table is not None and line.strip():
                key, _, value = line.strip().partition(" ")
                if key.isdigit():
                    table[int(key)] = value
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        shape, rest = _split_type(m.group(3))
        if "(" not in rest:
            continue
        opcode, operands, attrs, inner = _call_parts(rest)
        computations[current].append(Instr(m.group(2), shape, opcode, operands, attrs, bool(m.group(1)), inner))
    return computations, entry, tables


def _attr(attrs: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=%?([\w.\-]+)", attrs)
    return m.group(1) if m else None


def _frames(tables: dict):
    """stack_frame_id -> 'module.function:line < ...' for the innermost project frames."""
    files = {k: v.strip('"') for k, v in tables["FileNames"].items()}
    functions = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
    locations = {}
    for k, v in tables["FileLocations"].items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        path = files.get(int(f.get("file_name_id", 0)), "?")
        module = path.rsplit("/", 1)[-1].removesuffix(".py")
        function = functions.get(int(f.get("function_name_id", 0)), "?").split(".<locals>.")[-1]
        locations[k] = (path, f"{module}.{function}:{f.get('line', '?')}")
    frames = {}
    for k, v in tables["StackFrames"].items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        # parent_frame_id counts from 1 over the same table whose keys are printed from 1 as well, but
        # shifted: the parent of the frame printed as k is the one printed as parent_frame_id - 1.
        frames[k] = (int(f.get("file_location_id", 0)), int(f.get("parent_frame_id", 0)) - 1)

    def where(frame_id: int, depth: int = 3) -> str:
        names, seen = [], set()
        while frame_id in frames and frame_id not in seen and len(names) < depth:
            seen.add(frame_id)
            location, parent = frames[frame_id]
            path, name = locations.get(location, ("?", "?"))
            if "elmo_jax" in path or "optax" in path:
                names.append(name)
            frame_id = parent
        return " < ".join(names) or "-"

    return where


_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


def _is_collective(i: Instr) -> bool:
    """A collective op, or the TPU compiler's custom-call that starts or ends one asynchronously."""
    return i.opcode.startswith(COLLECTIVES) or (i.opcode == "custom-call" and "AsyncCollective" in i.attrs)


def _estimated_cycles(attrs: str) -> int | None:
    """The TPU compiler's cost-model estimate for one run of a kernel (its backend config's
    `"estimated_cycles":"N"`), or None where it gives none."""
    m = _CYCLES.search(attrs)
    return int(m.group(1)) if m else None


_REIFICATION = re.compile(r'"reification_cost":(\[[^\]]*\])')


def _reification(attrs: str) -> dict[str, tuple[float, float, float]]:
    """The GPU compiler's estimates for one run of a kernel (its backend config's `reification_cost`, written
    with `--xla_gpu_collect_cost_model_stats=true`): {cost model: (exec, compute, memory) seconds}."""
    m = _REIFICATION.search(attrs)
    if not m:
        return {}
    micro = lambda entry, key: float(entry.get(key, 0.0)) * 1e-6  # noqa: E731
    return {
        e.get("name", ""): (micro(e, "exec_time_us"), micro(e, "compute_time_us"), micro(e, "memory_access_time_us"))
        for e in json.loads(m.group(1))
    }


def _gemm_dimensions(instr: Instr) -> dict | None:
    """A library GEMM's dot dimensions (a cuBLAS custom-call's `gemm_backend_config`), or None."""
    if instr.opcode != "custom-call" or '"gemm_backend_config"' not in instr.attrs:
        return None
    m = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', instr.attrs)
    return {"lhs_contracting": [int(d) for d in re.findall(r"\d+", m.group(1))]} if m else None


def _trip_count(instr: Instr, computations) -> int:
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', instr.attrs)
    if m:
        return int(m.group(1))
    condition = computations.get(_attr(instr.attrs, "condition"), [])
    constants = {i.name: i for i in condition if i.opcode == "constant"}
    for i in condition:
        if i.opcode == "compare" and "direction=LT" in i.attrs:
            for operand in i.operands:
                if operand in constants and re.fullmatch(r"-?\d+", constants[operand].inner.strip()):
                    return int(constants[operand].inner)
    return 1


def mxu_passes(instr: Instr, shapes: dict[str, str]) -> int:
    """bfloat16 passes a TPU matrix unit makes for one product: float32 operands at HIGHEST precision take
    6, at HIGH 3 (the documented `jax.lax.Precision` behaviour on TPU), anything else 1."""
    dtypes = {dtype for o in instr.operands[:2] for dtype, _ in array_shapes(shapes.get(o, ""))}
    if "f32" not in dtypes:
        return 1
    m = re.search(r"operand_precision=\{(\w+)", instr.attrs)
    return {"highest": 6, "high": 3}.get(m.group(1) if m else "", 1)


def _dot_flops(instr: Instr, shapes: dict[str, str]) -> float:
    out = array_shapes(instr.shape)
    if not out:
        return 0.0
    out_elems = math.prod(out[0][1])  # a cuBLAS call's first result (its workspace follows)
    gemm = _gemm_dimensions(instr)
    if gemm is not None:
        lhs = array_shapes(shapes.get(instr.operands[0], ""))
        return 2.0 * out_elems * math.prod(lhs[0][1][d] for d in gemm["lhs_contracting"]) if lhs else 0.0
    if instr.opcode == "dot":
        lhs = array_shapes(shapes.get(instr.operands[0], ""))
        m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", instr.attrs)
        if not lhs or not m:
            return 0.0
        dims = [int(d) for d in m.group(1).split(",") if d]
        return 2.0 * out_elems * math.prod(lhs[0][1][d] for d in dims)
    if instr.opcode == "convolution":
        lhs = array_shapes(shapes.get(instr.operands[0], ""))
        rhs = array_shapes(shapes.get(instr.operands[1], ""))
        m = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instr.attrs)
        if not lhs or not rhs or not m:
            return 0.0
        lhs_labels, labels, out_labels = m.groups()
        kernel = rhs[0][1]
        per_output = math.prod(kernel) / kernel[labels.index("o")]  # kernel elements / output features
        window = re.search(r"window=\{([^}]*)\}", instr.attrs)
        if window:
            # Only taps that meet a real input count: the TPU compiler writes batched matmuls and
            # transposed products as convolutions with padded or lhs-dilated windows.
            spec = dict(re.findall(r"(\w+)=([0-9_x\-]+)", window.group(1)))
            for i, size in enumerate(int(k) for k in spec.get("size", "").split("x") if k):
                n = lhs[0][1][lhs_labels.index(str(i))]
                outputs = out[0][1][out_labels.index(str(i))]
                per_output *= _live_taps(n, outputs, size, spec, i) / (outputs * size)
        return 2.0 * out_elems * per_output
    return 0.0


def _live_taps(n: int, outputs: int, size: int, spec: dict, i: int) -> int:
    """Window taps of spatial dimension i, over all outputs, that land on one of the n real inputs."""
    pick = lambda key, default: int(spec[key].split("x")[i]) if key in spec else default  # noqa: E731
    low = int(spec["pad"].split("x")[i].split("_")[0]) if "pad" in spec else 0
    stride, lhs_dilate, rhs_dilate = pick("stride", 1), pick("lhs_dilate", 1), pick("rhs_dilate", 1)
    o = np.arange(outputs)[:, None]
    j = np.arange(size)[None, :]
    position = o * stride + j * rhs_dilate - low  # in the dilated, padded input
    live = (position >= 0) & (position % lhs_dilate == 0) & (position // lhs_dilate < n)
    return int(live.sum())


def _space(layout: str) -> int:
    """The memory space of an array layout: 0 (HBM, the default), 1 (TPU VMEM), 2 (SMEM), ..."""
    m = re.search(r"S\((\d+)\)", layout or "")
    return int(m.group(1)) if m else 0


def _bytes(shape: str, hbm: bool) -> float:
    """Bytes of an HLO type's arrays: all of them, or (hbm) only those in memory space 0."""
    return sum(
        DTYPE_BYTES.get(dtype, 4) * _tiled_elements(dims, layout)
        for dtype, dims, layout in _arrays(shape)
        if not hbm or _space(layout) == 0
    )


class _Analyser:
    def __init__(self, text: str):
        self.computations, self.entry, tables = parse(text)
        self.shapes = {i.name: i.shape for comp in self.computations.values() for i in comp}
        self.where = _frames(tables)
        self.items: list[Item] = []
        self.loops: list[tuple[str, int, str]] = []
        self._fusion_cache: dict = {}

    def fused(self, name: str):
        """A fused computation: (FLOPs, {parameter index: how it is read}, how the root is written).

        A parameter is read "all", or as a list of slice shapes (only sliced inside), or "none" (only
        updated in place); the root is written "all", or as a list of update shapes (in-place updates).
        """
        if name in self._fusion_cache:
            return self._fusion_cache[name]
        body = self.computations.get(name, [])
        flops = mxu = 0.0
        users = collections.defaultdict(list)
        params = {}
        by_name = {i.name: i for i in body}
        for i in body:
            if i.opcode == "parameter":
                params[i.name] = int(i.inner)
            for k, operand in enumerate(i.operands):
                users[operand].append((i, k))
            if i.opcode in ("dot", "convolution"):
                f = _dot_flops(i, self.shapes)
                flops += f
                mxu += f * mxu_passes(i, self.shapes)
            elif i.opcode == "fusion":
                inner = self.fused(_attr(i.attrs, "calls"))
                flops += inner[0]
                mxu += inner[3]
        root = next((i for i in body if i.root), None)
        # A TPU async collective fusion (see `_collective_start`) carries the collective's buffers through
        # unchanged: they are neither read nor written by it (the start counts the collective once).
        collective = {i.name for i in body if _is_collective(i)}
        reads = {
            index: "none"
            if collective and all(u.name in collective or (u.root and u.opcode == "tuple") for u, _ in users[pname])
            else self._param_read(pname, users, root.name if root else "")
            for pname, index in params.items()
        }
        passed = collective | ({n for n, i in by_name.items() if i.opcode == "parameter"} if collective else set())
        written = self._root_written(root, by_name, passed) if root else "all"
        self._fusion_cache[name] = (flops, reads, written, mxu)
        return self._fusion_cache[name]

    def _param_read(self, name: str, users, root: str):
        """How a fusion reads a value: "all", "none" or the shapes of its slices (see `fused`)."""
        if name == root:  # the value itself is (part of) the fusion's result, so all of it is read
            return "all"
        slices = []
        for user, k in users.get(name, []):
            if user.opcode == "bitcast":
                inner = self._param_read(user.name, users, root)
                if inner == "all":
                    return "all"
                slices += [] if inner == "none" else inner
            elif (user.opcode in SLICING or user.opcode == "gather") and k == 0:
                slices.append(user.shape)
            elif user.opcode in ("dynamic-update-slice", "scatter") and k == 0:
                continue  # updated in place: the untouched part is neither read nor written
            elif user.opcode == "fusion" and self.fused(_attr(user.attrs, "calls"))[1].get(k, "all") != "all":
                inner = self.fused(_attr(user.attrs, "calls"))[1][k]  # a nested fusion that slices it
                slices += [] if inner == "none" else inner
            elif user.opcode == "fusion" and self._elementwise(_attr(user.attrs, "calls")):
                # a nested elementwise fusion (a layout copy, a convert) reads what its own users read
                inner = self._param_read(user.name, users, root)
                if inner == "all":
                    return "all"
                slices += [] if inner == "none" else inner
            else:
                return "all"
        return slices or "none"

    def _elementwise(self, name: str) -> bool:
        return all(i.opcode not in NOT_ELEMENTWISE for i in self.computations.get(name, [None]) if i is not None)

    def _root_written(self, root: Instr, by_name, passed: set[str] = frozenset()):
        """ "all", or per result (one, or each of a tuple's) the shape written: an update's if in place,
        nothing ("") for the results named in `passed` (a collective's buffers passed through)."""
        parts = [by_name.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
        shapes, special = [], False
        for part in parts:
            if part is not None and part.name in passed:
                shapes.append("")
                special = True
            elif part is not None and part.opcode == "dynamic-update-slice":
                shapes.append(self.shapes.get(part.operands[1], ""))
                special = True
            elif part is not None and part.opcode == "scatter":
                shapes.append(self.shapes.get(part.operands[-1], ""))
                special = True
            elif part is not None and part.opcode == "fusion" and self.fused(_attr(part.attrs, "calls"))[2] != "all":
                # a nested fusion that updates in place (the TPU compiler wraps scatters this way)
                is_tuple, inner = self.fused(_attr(part.attrs, "calls"))[2]
                shapes.append(None if is_tuple or inner[0] is None else inner[0])
                special = shapes[-1] is not None or special
            else:
                shapes.append(None)  # all of the result
        return (root.opcode == "tuple", shapes) if special else "all"

    def _combines(self, scatter: Instr) -> bool:
        """Whether a scatter combines the update with what is there (scatter-add) rather than overwrites."""
        body = self.computations.get(_attr(scatter.attrs, "to_apply"), [])
        root = next((i for i in body if i.root), None)
        return root is not None and root.opcode != "parameter"

    def _rmw_updates(self, name: str) -> list:
        """Per result of a fused computation (one, or each of a tuple's): the update shape of a combining
        in-place scatter that writes it (its read-modify-write reads that much), else None."""
        body = self.computations.get(name, [])
        by_name = {i.name: i for i in body}
        root = next((i for i in body if i.root), None)
        if root is None:
            return []
        parts = [by_name.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
        out = []
        for part in parts:
            if part is not None and part.opcode == "scatter" and self._combines(part):
                out.append(self.shapes.get(part.operands[-1], ""))
            elif part is not None and part.opcode == "fusion":
                inner = self._rmw_updates(_attr(part.attrs, "calls"))
                out.append(inner[0] if len(inner) == 1 else None)
            else:
                out.append(None)
        return out

    def scatter_read(self, i: Instr) -> float:
        """The read half of a top-level fusion's in-place combining scatters, for results in HBM."""
        if i.opcode != "fusion":
            return 0.0  # an unfused scatter's traffic already counts all of its operand
        updates = self._rmw_updates(_attr(i.attrs, "calls"))
        elements = _tuple_elements(i.shape) if len(updates) > 1 else [i.shape]
        return sum(
            _bytes(update, False) for update, element in zip(updates, elements) if update and _bytes(element, True)
        )

    def _collective_start(self, i: Instr) -> Instr | None:
        """The collective a top-level fusion starts, if it is a TPU async collective start.

        The TPU compiler splits a collective it overlaps with other work into fusions that share its
        buffers: `async-collective-start` (a `custom-call` "AsyncCollectiveStart" around the collective),
        fusions that run the work it overlaps and carry the collective and its buffers along (inside a
        loop: every trip), and `async-collective-done`. Each holds a copy of the collective op; it runs
        once. Its bytes are counted at the start; the others count only their own work.
        """
        if i.opcode != "fusion":
            return None
        body = self.computations.get(_attr(i.attrs, "calls"), [])
        by_name = {b.name: b for b in body}
        for b in body:
            if b.opcode == "custom-call" and "AsyncCollectiveStart" in b.attrs and b.operands:
                wrapped = by_name.get(b.operands[0])
                return wrapped if wrapped is not None and wrapped.opcode.startswith(COLLECTIVES) else None
        return None

    def _traffic(self, i: Instr, hbm: bool) -> tuple[float, float]:
        """(bytes read, bytes written) by one top-level instruction; hbm: only arrays in HBM."""
        if i.opcode in ("copy-start", "slice-start"):  # asynchronous moves between memory spaces
            if not hbm:
                return 0.0, 0.0
            src = self.shapes.get(i.operands[0], "")
            # copy-start: (destination, source, context); slice-start: ((operands), destination, context)
            elements = _tuple_elements(i.shape)
            dst_type = elements[0 if i.opcode == "copy-start" else 1] if len(elements) > 1 else i.shape
            dst = _arrays(dst_type)[0] if _arrays(dst_type) else None
            if dst is None:
                return 0.0, 0.0
            dst_bytes = DTYPE_BYTES.get(dst[0], 4) * _tiled_elements(dst[1], dst[2])
            src_in_hbm = any(_space(layout) == 0 for _, _, layout in _arrays(src))
            return (dst_bytes if src_in_hbm else 0.0), (dst_bytes if _space(dst[2]) == 0 else 0.0)
        if i.opcode.endswith("-done") or i.opcode in FREE_OPS:
            return 0.0, 0.0
        written = _bytes(i.shape, hbm)
        if _gemm_dimensions(i) is not None:  # (result, workspace): the scratch workspace is not traffic
            written = _bytes(_tuple_elements(i.shape)[0], hbm)
        if i.opcode == "fusion":
            _, reads, root_written, _ = self.fused(_attr(i.attrs, "calls"))
            read = 0.0
            for k, operand in enumerate(i.operands):
                shape = self.shapes.get(operand, "")
                how = reads.get(k, "all")
                if how == "all" or (hbm and _bytes(shape, True) == 0):
                    read += _bytes(shape, hbm)
                elif how != "none":
                    # slices of an operand stored in HBM (or any operand, when counting all)
                    read += sum(_bytes(s, False) for s in how)
            if root_written != "all":  # per result: the update of an in-place one, else all of it
                is_tuple, parts = root_written
                elements = _tuple_elements(i.shape) if is_tuple else [i.shape]
                written = 0.0
                for part, element in zip(parts, elements):
                    if part is None:
                        written += _bytes(element, hbm)
                    elif _bytes(element, hbm) > 0:
                        written += _bytes(part, False)
            return read, written
        read = sum(_bytes(self.shapes.get(o, ""), hbm) for o in i.operands)
        if i.opcode == "dynamic-update-slice":
            update = _bytes(self.shapes.get(i.operands[1], ""), False)
            return (update if _bytes(i.shape, hbm) else 0.0), (update if _bytes(i.shape, hbm) else 0.0)
        return read, written

    def walk(self, computation: str, count: int, in_loop: bool) -> None:
        for i in self.computations.get(computation, []):
            if i.opcode in FREE_OPS - {"copy-start"} or (i.opcode == "custom-call" and "AllocateBuffer" in i.attrs):
                continue
            op_name = (re.search(r'op_name="([^"]*)"', i.attrs) or [None, ""])[1]
            frame = re.search(r"stack_frame_id=(\d+)", i.attrs)
            where = self.where(int(frame.group(1))) if frame else "-"
            if i.opcode == "while":
                trips = _trip_count(i, self.computations)
                self.loops.append((i.name, trips, op_name))
                self.walk(_attr(i.attrs, "body"), count * trips, True)
                continue
            if i.opcode in ("call", "async-start"):
                self.walk(_attr(i.attrs, "calls") or _attr(i.attrs, "to_apply"), count, in_loop)
                continue
            if i.opcode == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", i.attrs)
                names = re.findall(r"%?([\w.\-]+)", branches.group(1)) if branches else []
                names += [n for n in (_attr(i.attrs, "true_computation"), _attr(i.attrs, "false_computation")) if n]
                for n in names[:1]:  # the first branch stands for all
                    self.walk(n, count, in_loop)
                continue
            if i.opcode in ("async-done", "async-update"):
                continue
            if i.opcode == "fusion":
                flops, mxu = (lambda f: (f[0], f[3]))(self.fused(_attr(i.attrs, "calls")))
            else:
                flops = _dot_flops(i, self.shapes)
                mxu = flops * mxu_passes(i, self.shapes)
            all_read, all_written = self._traffic(i, hbm=False)
            hbm_read, hbm_written = self._traffic(i, hbm=True)
            is_collective = i.opcode.startswith(COLLECTIVES) and not i.opcode.endswith("-done")
            collective = _bytes(i.shape, False) if is_collective else 0.0
            if is_collective and i.opcode.endswith("-start"):
                # (operands, results) tuples: the results; an array (the GPU's all-reduce-start): all of it
                parts = _tuple_elements(i.shape)
                collective = _bytes(parts[1], False) if len(parts) == 2 else _bytes(i.shape, False)
            started = self._collective_start(i)
            if started is not None:  # the collective's input read and its result written, once
                source, result = self.shapes.get(started.operands[0], ""), started.shape
                collective = _bytes(result, False)
                # Where they live is the start's own result: (input, result, synchronisation flags).
                placed = _tuple_elements(i.shape)
                source_at, result_at = placed[:2] if len(placed) >= 2 else (source, result)
                all_read, all_written = all_read + _bytes(source, False), all_written + collective
                hbm_read, hbm_written = hbm_read + _bytes(source_at, True), hbm_written + _bytes(result_at, True)
            self.items.append(
                Item(
                    name=i.name,
                    opcode=i.opcode,
                    op_name=op_name,
                    where=where,
                    count=count,
                    flops=flops * count,
                    mxu_flops=mxu * count,
                    bytes=(all_read + all_written) * count,
                    hbm_bytes=(hbm_read + hbm_written) * count,
                    collective_bytes=collective * count,
                    in_loop=in_loop,
                    scatter_read_bytes=self.scatter_read(i) * count,
                    cycles=_estimated_cycles(i.attrs) * count if _estimated_cycles(i.attrs) is not None else None,
                    collective=started.opcode if started is not None else "",
                    estimates={k: tuple(x * count for x in v) for k, v in _reification(i.attrs).items()},
                )
            )


def analyse(text: str) -> Cost:
    """The loop-counted FLOPs, bytes and collectives of an optimised HLO module (`compiled.as_text()`)."""
    a = _Analyser(text)
    a.walk(a.entry, 1, False)
    return Cost(
        flops=sum(i.flops for i in a.items),
        mxu_flops=sum(i.mxu_flops for i in a.items),
        bytes=sum(i.bytes for i in a.items),
        hbm_bytes=sum(i.hbm_bytes for i in a.items),
        collective_bytes=sum(i.collective_bytes for i in a.items),
        collective_bytes_in_loops=sum(i.collective_bytes for i in a.items if i.in_loop),
        items=a.items,
        loops=a.loops,
    )


def analyse_once(text: str) -> Cost:
    """As `analyse`, but every loop body counted once (what XLA's cost analysis does): for checking."""
    global _trip_count
    saved = _trip_count
    _trip_count = lambda instr, computations: 1  # noqa: E731
    try:
        return analyse(text)
    finally:
        _trip_count = saved


V5E = (197e12, 819e9, 1.5e9)  # v5e's bfloat16 FLOP/s, HBM bytes/s and clock (bench/tpu_compile.py's CHIPS)


def print_kinds(kinds: dict[str, dict[str, float]], title: str, scale: float = 1e3) -> None:
    """`Cost.by_kind`'s table (times x scale: ms from seconds; 1 for rows already in ms)."""
    print(f"  {title}:")
    print(f"    {'kind':<46} {'est.':>7} {'FLOP':>7} {'HBM':>7} {'serial':>7} kernels")
    for name, t in kinds.items():
        print(
            f"    {name:<46} {t['estimated_s'] * scale:7.2f} {t['flop_s'] * scale:7.2f} "
            f"{t['hbm_s'] * scale:7.2f} {t['serial_s'] * scale:7.2f} {int(t['kernels'])}"
        )


def main(argv: list[str]) -> None:
    """python bench/hlo_cost.py HLO_FILE [N [KEY]]: totals, the N largest instructions by KEY (hbm_bytes,
    the default; cycles: the compiler's estimate; flops; scatter_read_bytes) and the N largest source
    locations (innermost project frames) by HBM bytes."""
    text = open(argv[1]).read()
    n = int(argv[2]) if len(argv) > 2 else 20
    key = argv[3] if len(argv) > 3 else "hbm_bytes"
    cost = analyse(text)
    estimated = [i for i in cost.items if i.cycles is not None]
    print(
        f"FLOPs {cost.flops / 1e9:,.0f} G (MXU passes {cost.mxu_flops / 1e9:,.0f} G), "
        f"HBM {cost.hbm_bytes / 1e9:.2f} GB (+{cost.scatter_read_bytes / 1e9:.2f} GB scatter reads), "
        f"collectives {cost.collective_bytes / 1e9:.2f} GB ({cost.collective_bytes_in_loops / 1e9:.2f} GB inside loops)"
    )
    print(
        f"estimated cycles {sum(i.cycles for i in estimated) / 1e6:,.2f} M over {len(estimated)} of "
        f"{len(cost.items)} kernels; without an estimate: "
        f"{sum(i.hbm_bytes + i.scatter_read_bytes for i in cost.items if i.cycles is None) / 1e9:.2f} GB"
    )
    print("loops (trip counts):", ", ".join(f"{name} x{trips}" for name, trips, _ in cost.loops))
    print_kinds(cost.by_kind(*V5E), "by kind of kernel, ms at v5e's figures")
    for i in sorted(cost.items, key=lambda i: -(getattr(i, key) or 0))[:n]:
        cycles = f"{i.cycles / 1e6:8.3f} Mc" if i.cycles is not None else "     - Mc"
        print(f"{i.hbm_bytes / 1e9:7.3f} GB {cycles} x{i.count:<4} {i.opcode:<12} {i.where[:80]:<80} {i.op_name[-50:]}")
    print("by source location:")
    for where, total in cost.by_where("hbm_bytes")[:n]:
        print(f"{total / 1e9:7.3f} GB  {where}")


if __name__ == "__main__":
    import sys

    main(sys.argv)
