"""bench/hlo_cost.py's readings of a compiled program, on a small hand-written HLO module (no libtpu, no
compiling): the read half of a scatter-add's read-modify-write, the serial per-kernel roofline, the
compiler-estimated time (each kernel's `estimated_cycles` times its loop trips at a clock, plus the
serial time of kernels without an estimate) and collectives by kind."""

from __future__ import annotations

import pytest

from bench import hlo_cost

HLO = """HloModule m, entry_computation_layout={()->f32[]}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%take (c: f32[], d: f32[]) -> f32[] {
  %c = f32[] parameter(0)
  ROOT %d = f32[] parameter(1)
}

%scatter_add_fused (p0: f32[1024,128], p1: s32[16,1], p2: f32[16,128]) -> f32[1024,128] {
  %p0 = f32[1024,128]{1,0} parameter(0)
  %p1 = s32[16,1]{1,0} parameter(1)
  %p2 = f32[16,128]{1,0} parameter(2)
  ROOT %sc = f32[1024,128]{1,0} scatter(%p0, %p1, %p2), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}

%scatter_set_fused (q0: f32[1024,128], q1: s32[16,1], q2: f32[16,128]) -> f32[1024,128] {
  %q0 = f32[1024,128]{1,0} parameter(0)
  %q1 = s32[16,1]{1,0} parameter(1)
  %q2 = f32[16,128]{1,0} parameter(2)
  ROOT %sc.1 = f32[1024,128]{1,0} scatter(%q0, %q1, %q2), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%take
}

%dot_fused (r0: bf16[128,256], r1: bf16[256,256]) -> bf16[128,256] {
  %r0 = bf16[128,256]{1,0} parameter(0)
  %r1 = bf16[256,256]{1,0} parameter(1)
  ROOT %dot.1 = bf16[128,256]{1,0} dot(%r0, %r1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (t: (s32[], bf16[128,256], bf16[256,256])) -> (s32[], bf16[128,256], bf16[256,256]) {
  %t = (s32[], bf16[128,256]{1,0}, bf16[256,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %h = bf16[128,256]{1,0} get-tuple-element(%t), index=1
  %w = bf16[256,256]{1,0} get-tuple-element(%t), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one), backend_config={"window_config":{"estimated_cycles":"10"}}
  %h.1 = bf16[128,256]{1,0} fusion(%h, %w), kind=kOutput, calls=%dot_fused, backend_config={"window_config":{"estimated_cycles":"1000"}}
  ROOT %t.1 = (s32[], bf16[128,256]{1,0}, bf16[256,256]{1,0}) tuple(%next, %h.1, %w)
}

%cond (u: (s32[], bf16[128,256], bf16[256,256])) -> pred[] {
  %u = (s32[], bf16[128,256]{1,0}, bf16[256,256]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%u), index=0
  %four = s32[] constant(4)
  ROOT %lt = pred[] compare(%j, %four), direction=LT
}

ENTRY %main (table: f32[1024,128], ids: s32[16,1], rows: f32[16,128], h0: bf16[128,256], k: bf16[256,256]) -> f32[1024,128] {
  %table = f32[1024,128]{1,0} parameter(0)
  %ids = s32[16,1]{1,0} parameter(1)
  %rows = f32[16,128]{1,0} parameter(2)
  %h0 = bf16[128,256]{1,0} parameter(3)
  %k = bf16[256,256]{1,0} parameter(4)
  %added = f32[1024,128]{1,0} fusion(%table, %ids, %rows), kind=kCustom, calls=%scatter_add_fused
  %set = f32[1024,128]{1,0} fusion(%added, %ids, %rows), kind=kCustom, calls=%scatter_set_fused
  %summed = f32[16,128]{1,0} all-reduce(%rows), replica_groups={}, to_apply=%add
  %zero = s32[] constant(0)
  %init = (s32[], bf16[128,256]{1,0}, bf16[256,256]{1,0}) tuple(%zero, %h0, %k)
  %loop = (s32[], bf16[128,256]{1,0}, bf16[256,256]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  ROOT %out = f32[1024,128]{1,0} copy(%set), backend_config={"window_config":{"estimated_cycles":"500"}}
}
"""  # noqa: E501 (HLO lines as the compiler writes them)

UPDATE = 16 * 128 * 4  # one scatter's update rows, f32
TABLE = 1024 * 128 * 4
PEAK, BANDWIDTH, CLOCK = 1e12, 1e9, 1e9  # round figures: FLOP/s, HBM bytes/s, cycles/s


@pytest.fixture(scope="module")
def cost():
    return hlo_cost.analyse(HLO)


def item(cost, opcode, op_name=None, name=None):
    return next(i for i in cost.items if i.opcode == opcode and (name is None or i.name == name))


def test_only_a_combining_scatter_reads_what_it_updates(cost):
    added, overwritten = item(cost, "fusion", name="added"), item(cost, "fusion", name="set")
    # both count the update written and their ids and rows read, not the untouched table
    assert added.hbm_bytes == overwritten.hbm_bytes == UPDATE + 64 + UPDATE
    assert added.scatter_read_bytes == UPDATE  # scatter-add: the rows it adds to are read first
    assert overwritten.scatter_read_bytes == 0  # scatter that overwrites: nothing read back
    assert cost.scatter_read_bytes == UPDATE


def test_estimated_cycles_are_counted_per_loop_trip(cost):
    product = item(cost, "fusion", name="h.1")
    assert product.count == 4 and product.cycles == 4 * 1000
    assert product.flops == 4 * 2 * 128 * 256 * 256
    assert item(cost, "copy", name="out").cycles == 500
    assert item(cost, "fusion", name="added").cycles is None  # the scatters carry no estimate
    assert item(cost, "all-reduce").cycles is None


def test_the_three_times(cost):
    t = cost.times(PEAK, BANDWIDTH, CLOCK)
    per = {i.name: i.seconds(PEAK, BANDWIDTH, CLOCK) for i in cost.items}
    # the roofline's HBM time counts the scatter-add's read
    assert t["hbm_s"] == pytest.approx((cost.hbm_bytes + UPDATE) / BANDWIDTH)
    assert t["flop_s"] == pytest.approx(4 * 2 * 128 * 256 * 256 / PEAK)
    # serial: each kernel's own max(FLOP time, HBM time), summed
    product = item(cost, "fusion", name="h.1")
    product_hbm = 4 * (2 * 128 * 256 * 2 + 256 * 256 * 2) / BANDWIDTH
    assert per["h.1"]["serial_s"] == pytest.approx(max(product.flops / PEAK, product_hbm))
    assert t["serial_s"] == pytest.approx(sum(p["serial_s"] for p in per.values()))
    assert t["serial_s"] >= max(t["flop_s"], t["hbm_s"]) * (1 - 1e-12)
    # estimated: cycles at the clock where there are some, the serial time of the others
    no_estimate = ["added", "set", "summed"]
    unestimated = sum(per[n]["serial_s"] for n in no_estimate)
    assert unestimated == pytest.approx((2 * (2 * UPDATE + 64) + UPDATE + 2 * UPDATE) / BANDWIDTH)
    assert t["unestimated_s"] == pytest.approx(unestimated)
    assert t["estimated_s"] == pytest.approx((4 * 1000 + 4 * 10 + 500) / CLOCK + unestimated)
    assert cost.times(PEAK, BANDWIDTH, None)["estimated_s"] is None  # no clock, no estimate


def test_collectives_by_kind_and_the_slowest_kernels(cost):
    assert cost.collectives_by_kind() == {"all-reduce": UPDATE}
    top = cost.top_by_time(2, PEAK, BANDWIDTH, CLOCK)
    assert [i.name for i, _ in top] == ["added", "set"]  # 16.4 us each of HBM time against 4 us of cycles
    by_cycles = cost.top_by_time(1, PEAK, BANDWIDTH, CLOCK, key="flop_s")
    assert by_cycles[0][0].name == "h.1"


def test_the_estimate_by_kind_of_kernel(cost):
    kinds = cost.by_kind(PEAK, BANDWIDTH, CLOCK)
    per = {i.name: i.seconds(PEAK, BANDWIDTH, CLOCK) for i in cost.items}
    products = kinds[f"{hlo_cost.PRODUCTS}, in loops"]  # the loop's dot fusion, 4 trips
    assert products["kernels"] == 1 and products["estimated_s"] == pytest.approx(4 * 1000 / CLOCK)
    assert products["flop_s"] == pytest.approx(4 * 2 * 128 * 256 * 256 / PEAK)
    # the loop counter's add and the final copy: estimated, no matrix-unit FLOPs
    assert kinds[f"{hlo_cost.ELEMENTWISE}, in loops"]["estimated_s"] == pytest.approx(4 * 10 / CLOCK)
    assert kinds[f"{hlo_cost.ELEMENTWISE}, outside loops"]["estimated_s"] == pytest.approx(500 / CLOCK)
    unestimated = kinds[f"{hlo_cost.UNESTIMATED}, outside loops"]  # both scatters and the all-reduce, ...
    assert unestimated["estimated_s"] == pytest.approx(sum(per[n]["serial_s"] for n in ("added", "set", "summed")))
    assert unestimated["estimated_s"] == pytest.approx(unestimated["hbm_s"])  # ... at their HBM time
    # every kernel in exactly one kind: the kinds add up to the totals
    t = cost.times(PEAK, BANDWIDTH, CLOCK)
    for key in ("estimated_s", "serial_s", "flop_s"):
        assert sum(k[key] for k in kinds.values()) == pytest.approx(t[key])
    assert sum(k["kernels"] for k in kinds.values()) == len(cost.items)
    assert list(kinds) == sorted(kinds, key=lambda name: -kinds[name]["estimated_s"])


# A collective the TPU compiler overlaps with a loop (its async collective fusions, as in the optimised
# v5e-64 train step): the start wraps the all-gather in a custom-call "AsyncCollectiveStart", each loop
# trip's product carries the gathered buffer along with its own work (another copy of the all-gather op
# inside), and the done returns the buffer. The all-gather runs once.
ASYNC_HLO = """HloModule a, entry_computation_layout={()->f32[8,4,128]}

%start_fused (s0: f32[1,4,128]) -> (f32[1,4,128], f32[8,4,128], u32[]) {
  %s0 = f32[1,4,128]{2,1,0} parameter(0)
  %ag.0 = f32[8,4,128]{2,1,0} all-gather(%s0), channel_id=1, replica_groups={}, dimensions={0}
  ROOT %cc.0 = (f32[1,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, u32[]{:S(2)}) custom-call(%ag.0), custom_call_target="AsyncCollectiveStart"
}

%step_fused (x0: bf16[64,128], x1: bf16[128,128], x2: f32[1,4,128], x3: f32[8,4,128], x4: u32[]) -> (bf16[64,128], f32[1,4,128], f32[8,4,128], f32[8,4,128], u32[]) {
  %x0 = bf16[64,128]{1,0} parameter(0)
  %x1 = bf16[128,128]{1,0} parameter(1)
  %x2 = f32[1,4,128]{2,1,0} parameter(2)
  %x3 = f32[8,4,128]{2,1,0} parameter(3)
  %x4 = u32[]{:S(2)} parameter(4)
  %prod = bf16[64,128]{1,0} dot(%x0, %x1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ag.1 = f32[8,4,128]{2,1,0} all-gather(%x2), channel_id=1, replica_groups={}, dimensions={0}
  ROOT %tup = (bf16[64,128]{1,0}, f32[1,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, u32[]{:S(2)}) tuple(%prod, %x2, %x3, %ag.1, %x4)
}

%done_fused (d0: f32[1,4,128], d1: f32[8,4,128], d2: u32[]) -> f32[8,4,128] {
  %d0 = f32[1,4,128]{2,1,0} parameter(0)
  %d1 = f32[8,4,128]{2,1,0} parameter(1)
  %d2 = u32[]{:S(2)} parameter(2)
  %ag.2 = f32[8,4,128]{2,1,0} all-gather(%d0), channel_id=1, replica_groups={}, dimensions={0}
  ROOT %cc.2 = f32[8,4,128]{2,1,0} custom-call(%d0, %d1, %ag.2, %d2), custom_call_target="AsyncCollectiveDone"
}

%body (t: (s32[], bf16[64,128], bf16[128,128], f32[1,4,128], f32[8,4,128], u32[])) -> (s32[], bf16[64,128], bf16[128,128], f32[1,4,128], f32[8,4,128], u32[]) {
  %t = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}, f32[1,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, u32[]{:S(2)}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %h = bf16[64,128]{1,0} get-tuple-element(%t), index=1
  %w = bf16[128,128]{1,0} get-tuple-element(%t), index=2
  %src = f32[1,4,128]{2,1,0} get-tuple-element(%t), index=3
  %buf = f32[8,4,128]{2,1,0} get-tuple-element(%t), index=4
  %sem = u32[]{:S(2)} get-tuple-element(%t), index=5
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %step = (bf16[64,128]{1,0}, f32[1,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, u32[]{:S(2)}) fusion(%h, %w, %src, %buf, %sem), kind=kOutput, output_to_operand_aliasing={{1}: (2, {}), {2}: (3, {}), {3}: (3, {}), {4}: (4, {})}, calls=%step_fused
  %h.1 = bf16[64,128]{1,0} get-tuple-element(%step), index=0
  %buf.1 = f32[8,4,128]{2,1,0} get-tuple-element(%step), index=3
  ROOT %t.1 = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}, f32[1,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, u32[]{:S(2)}) tuple(%next, %h.1, %w, %src, %buf.1, %sem)
}

%cond (u: (s32[], bf16[64,128], bf16[128,128], f32[1,4,128], f32[8,4,128], u32[])) -> pred[] {
  %u = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}, f32[1,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, u32[]{:S(2)}) parameter(0)
  %j = s32[] get-tuple-element(%u), index=0
  %ten = s32[] constant(10)
  ROOT %lt = pred[] compare(%j, %ten), direction=LT
}

ENTRY %main (rows: f32[1,4,128], h0: bf16[64,128], k: bf16[128,128]) -> f32[8,4,128] {
  %rows = f32[1,4,128]{2,1,0} parameter(0)
  %h0 = bf16[64,128]{1,0} parameter(1)
  %k = bf16[128,128]{1,0} parameter(2)
  %started = (f32[1,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, u32[]{:S(2)}) fusion(%rows), kind=kCustom, output_to_operand_aliasing={{0}: (0, {})}, calls=%start_fused
  %src.0 = f32[1,4,128]{2,1,0} get-tuple-element(%started), index=0
  %buf.0 = f32[8,4,128]{2,1,0} get-tuple-element(%started), index=1
  %sem.0 = u32[]{:S(2)} get-tuple-element(%started), index=2
  %zero = s32[] constant(0)
  %init = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}, f32[1,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, u32[]{:S(2)}) tuple(%zero, %h0, %k, %src.0, %buf.0, %sem.0)
  %loop = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}, f32[1,4,128]{2,1,0}, f32[8,4,128]{2,1,0}, u32[]{:S(2)}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
  %src.2 = f32[1,4,128]{2,1,0} get-tuple-element(%loop), index=3
  %buf.2 = f32[8,4,128]{2,1,0} get-tuple-element(%loop), index=4
  %sem.2 = u32[]{:S(2)} get-tuple-element(%loop), index=5
  ROOT %gathered = f32[8,4,128]{2,1,0} fusion(%src.2, %buf.2, %sem.2), kind=kCustom, output_to_operand_aliasing={{}: (1, {})}, calls=%done_fused
}
"""  # noqa: E501 (HLO lines as the compiler writes them)


def test_a_collective_overlapped_with_a_loop_is_counted_once():
    """An async collective's buffers, carried through each loop trip's fusion, were counted as read and
    written by every trip (the v5e-64 step's counted traffic: 1,249 GB per chip instead of 41)."""
    cost = hlo_cost.analyse(ASYNC_HLO)
    part, gathered = 4 * 128 * 4, 8 * 4 * 128 * 4  # f32: one device's rows, all eight devices'
    start, step, done = (item(cost, "fusion", name=n) for n in ("started", "step", "gathered"))
    assert cost.collectives_by_kind() == {"all-gather": gathered}
    assert start.collective_bytes == gathered and start.hbm_bytes == part + gathered
    assert step.count == 10 and step.collective_bytes == 0
    # each trip: the product's operands and result, nothing of the collective's buffers
    assert step.hbm_bytes == 10 * (64 * 128 * 2 + 128 * 128 * 2 + 64 * 128 * 2)
    assert step.flops == 10 * 2 * 64 * 128 * 128
    assert done.hbm_bytes == 0 and done.collective_bytes == 0
    assert cost.hbm_bytes == start.hbm_bytes + step.hbm_bytes + 10 * 3 * 4  # and the loop counter's add


# The GPU compiler's program (as `--xla_gpu_collect_cost_model_stats=true` writes it): a loop of 3 trips
# running a cuBLAS GEMM (a custom-call whose result is (product, scratch workspace), priced only by the
# compiler's speed-of-light model "sol") and an elementwise fusion it prices with its own model ("") and
# "sol"; after the loop a copy with no estimate. Times in microseconds, as the compiler writes them.
GPU_HLO = """HloModule g, entry_computation_layout={()->bf16[64,128]}

%tanh_fused (a0: bf16[64,128]) -> bf16[64,128] {
  %a0 = bf16[64,128]{1,0} parameter(0)
  ROOT %th = bf16[64,128]{1,0} tanh(%a0)
}

%body (t: (s32[], bf16[64,128], bf16[128,128])) -> (s32[], bf16[64,128], bf16[128,128]) {
  %t = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %h = bf16[64,128]{1,0} get-tuple-element(%t), index=1
  %w = bf16[128,128]{1,0} get-tuple-element(%t), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %gemm = (bf16[64,128]{1,0}, s8[1048576]{0}) custom-call(%h, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}},"reification_cost":[{"end_to_end_cycles":0,"exec_time_us":5,"compute_time_us":0,"memory_access_time_us":0,"name":"sol"}]}
  %product = bf16[64,128]{1,0} get-tuple-element(%gemm), index=0
  %h.1 = bf16[64,128]{1,0} fusion(%product), kind=kLoop, calls=%tanh_fused, backend_config={"reification_cost":[{"end_to_end_cycles":10,"exec_time_us":2,"compute_time_us":0.5,"memory_access_time_us":1.5,"name":""},{"end_to_end_cycles":0,"exec_time_us":1,"compute_time_us":0,"memory_access_time_us":0,"name":"sol"}]}
  ROOT %t.1 = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}) tuple(%next, %h.1, %w)
}

%cond (u: (s32[], bf16[64,128], bf16[128,128])) -> pred[] {
  %u = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%u), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%j, %three), direction=LT
}

ENTRY %main (h0: bf16[64,128], k: bf16[128,128]) -> bf16[64,128] {
  %h0 = bf16[64,128]{1,0} parameter(0)
  %k = bf16[128,128]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}) tuple(%zero, %h0, %k)
  %loop = (s32[], bf16[64,128]{1,0}, bf16[128,128]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %last = bf16[64,128]{1,0} get-tuple-element(%loop), index=1
  ROOT %out = bf16[64,128]{1,0} copy(%last)
}
"""  # noqa: E501 (HLO lines as the compiler writes them)

H, W = 64 * 128 * 2, 128 * 128 * 2  # bytes of the state and of the kernel, bf16


def test_the_gpu_compilers_estimates_and_cublas_gemms():
    cost = hlo_cost.analyse(GPU_HLO)
    gemm, tanh, copy, counter = (item(cost, op) for op in ("custom-call", "fusion", "copy", "add"))
    # the GEMM's FLOPs from its dot dimensions; its traffic without the 1 MiB workspace, 3 trips
    assert gemm.flops == 3 * 2 * 64 * 128 * 128 and gemm.hbm_bytes == 3 * (H + W + H)
    assert tanh.hbm_bytes == 3 * 2 * H and copy.hbm_bytes == 2 * H
    # the compiler's own time where it gives one (the fusion); "sol" alone (the GEMM) is not used as one
    assert tanh.estimate_s == pytest.approx(3 * 2e-6) and gemm.estimate_s is None and copy.estimate_s is None
    assert [tanh.estimated, gemm.estimated, copy.estimated] == [True, False, False]
    t = cost.times(PEAK, BANDWIDTH, None)
    serial = lambda i: max(i.mxu_flops / PEAK, i.hbm_bytes / BANDWIDTH)  # noqa: E731
    unestimated = serial(gemm) + serial(copy) + serial(counter)  # (the loop counter's add: 3 x 12 bytes)
    assert t["unestimated_s"] == pytest.approx(unestimated)
    assert t["estimated_s"] == pytest.approx(3 * 2e-6 + unestimated)
    assert t["estimated_kernels"] == 1
    # summed per model, loop trips counted: (exec, compute, memory) and the kernels each priced
    sums = cost.gpu_estimates()
    assert sums[""] == pytest.approx({"exec_s": 6e-6, "compute_s": 1.5e-6, "memory_s": 4.5e-6, "kernels": 1})
    assert sums["sol"] == pytest.approx({"exec_s": 3 * 5e-6 + 3 * 1e-6, "compute_s": 0, "memory_s": 0, "kernels": 2})
    kinds = cost.by_kind(PEAK, BANDWIDTH, None)
    assert kinds[f"{hlo_cost.UNESTIMATED}, in loops"]["kernels"] == 2  # the GEMM and the counter's add
    assert kinds[f"{hlo_cost.ELEMENTWISE}, in loops"]["estimated_s"] == pytest.approx(6e-6)


def test_an_asynchronous_collective_counts_its_result():
    """The GPU's all-gather-start returns (operands, results), its all-reduce-start the result alone."""
    text = """HloModule c, entry_computation_layout={()->f32[8,64]}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[1,64], y: f32[256]) -> f32[8,64] {
  %x = f32[1,64]{1,0} parameter(0)
  %y = f32[256]{0} parameter(1)
  %ags = ((f32[1,64]{1,0}), (f32[8,64]{1,0})) all-gather-start(%x), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %agd = f32[8,64]{1,0} all-gather-done(%ags)
  %ars = f32[256]{0} all-reduce-start(%y), channel_id=2, replica_groups=[1,8]<=[8], to_apply=%add
  %ard = f32[256]{0} all-reduce-done(%ars)
  ROOT %out = f32[8,64]{1,0} copy(%agd)
}
"""  # noqa: E501 (HLO lines as the compiler writes them)
    assert hlo_cost.analyse(text).collectives_by_kind() == {"all-gather": 8 * 64 * 4, "all-reduce": 256 * 4}
