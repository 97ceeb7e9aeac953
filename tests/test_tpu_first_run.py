"""bench/tpu_first_run.py, the script a user runs first on a real TPU VM, in its CPU smoke mode
(configs/tiny.py's train step, a 1 x 1 mesh, in this process), and how it picks the cases and estimates
of a results file for the machine it runs on."""

from __future__ import annotations

import json

from bench import tpu_first_run

ROW = {  # a results row as bench/tpu_compile.py writes it, round figures: 1 ms of FLOPs, 2 ms of HBM
    "case": "v5e-1/small/bfloat16/1x1/128",
    "revision": "abc1234",
    "device_kind": "TPU v5 lite",
    "chips": 1,
    "mxu_flops": 197e9,
    "hbm_bytes": 819e6 * 2,
    "scatter_read_bytes": 819e6,
    "serial_ms": 4.0,
    "estimated_ms": 8.0,
    "model_flops_per_chip": 197e9,
    "tokens": 5120,
    "total": 2**30,
    "collective_bytes": 0.0,
}


def test_cases_and_estimates_come_from_the_rows_of_this_machine():
    embed = {**ROW, "case": "v5e-1/embed/bfloat16/1x1/64"}
    other = {**ROW, "case": "v6e-1/small/bfloat16/1x1/128", "device_kind": "TPU v6 lite"}
    assert tpu_first_run.runnable_cases([ROW, embed, other], "TPU v5 lite", 1) == [ROW["case"]]
    assert tpu_first_run.runnable_cases([ROW], "TPU v5 lite", 8) == []
    e = tpu_first_run.estimates(ROW)
    assert e == {"roofline_ms": 3.0, "serial_ms": 4.0, "estimated_ms": 8.0, "flop_ms": 1.0}  # scatter reads counted
    measured = {"first_s": 9.0, "step_s": [0.016, 0.012, 0.020], "tokens": 5120, "distinct_slots": 3200}
    r = tpu_first_run.report(ROW["case"], measured, ROW, "x")
    assert r["median_ms"] == 16.0 and r["best_ms"] == 12.0 and r["measured_util"] == 1.0 / 16
    assert r["distinct_slots"] == 3200
    assert r["measured_over_estimated"] == 2.0 and r["measured_over_roofline"] == 16.0 / 3


def test_the_smoke_run_times_the_train_step_and_writes_a_json_line(tmp_path, capsys):
    output = tmp_path / "first_run.jsonl"
    options = tpu_first_run.Options(smoke=True, warmup=0, steps=1, estimates=str(tmp_path / "none"), output=str(output))
    (r,) = tpu_first_run.run(options)
    assert r["case"] == tpu_first_run.SMOKE_CASE and r["steps"] == 1 and r["median_ms"] > 0
    assert r["estimated_ms"] is None  # no results row for the smoke case
    assert json.loads(output.read_text()) == r
    assert f"| {tpu_first_run.SMOKE_CASE} |" in capsys.readouterr().out


def test_a_gpu_runs_its_rows_smallest_first_with_the_triton_programs_estimate_beside():
    h100 = {**ROW, "device_kind": "NVIDIA H100 80GB HBM3"}
    large = {**h100, "case": "h100-1/large/bfloat16/1x1/128"}
    small = {**h100, "case": "h100-1/small/bfloat16/1x1/128"}
    triton = {**small, "case": "h100-1/small/bfloat16/1x1/128/triton", "estimated_ms": 5.0}
    bigger = {**h100, "case": "h100-1/small/bfloat16/1x1/64"}
    rows = [large, triton, small, bigger]
    expected = [bigger["case"], small["case"], large["case"]]  # by batch, then bilm_small first
    assert tpu_first_run.runnable_cases(rows, "NVIDIA H100 80GB HBM3", 1) == expected
    assert tpu_first_run.runnable_cases(rows, "NVIDIA H100 PCIe", 1) == []  # another part: other figures
    measured = {"first_s": 9.0, "step_s": [0.016], "tokens": 5120, "distinct_slots": None}
    r = tpu_first_run.report(small["case"], measured, small, "NVIDIA H100 80GB HBM3", triton)
    assert r["estimated_ms"] == 8.0 and r["estimated_triton_ms"] == 5.0
    assert tpu_first_run.line(r).endswith("| 2.00 | 5.00 |")  # measured / estimated, then Triton's estimate
