"""What the training loop does with each step's metrics, read one step late (so the host never waits
on the device): the console line, `metrics.jsonl` / TensorBoard, and the non-finite policy.

Non-finite policy: a NaN or Inf loss or gradient norm stops training with a `TrainingError` naming the
step; the state of that step is never checkpointed (the loop reads a step's metrics before saving it),
so the last checkpoint is the last good one. With `max_nonfinite_steps` = N > 0 the jitted step skips
such steps itself (`jitted_steps.skip_nonfinite_step`: parameters and optimiser state unchanged, decided on the
device) and this counts them: up to N are logged as warnings (and as `nonfinite_skipped` in every
metrics record), the N+1-th stops training as above. The count is saved with each checkpoint.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math

import jax
from absl import logging

from elmo_jax import storage
from elmo_jax.runtime.progress import Progress, duration
from elmo_jax.training.batch_feed import step_shape
from elmo_jax.training.metrics_log import MetricsLog


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the message says why and what is kept."""


# Before a run has measured an evaluation, its costs are estimated from training's: the eval step is a
# forward pass with the full softmax, no backward pass and no optimiser. Measured on the demo (2-core CPU,
# bilm's demo config): a window 0.049 s against a training step's 0.074 s; the eval step compiled in
# 1.2-1.5 s per character width against 7.2-7.9 s for the training step.
EVAL_WINDOW_PER_STEP = 0.66
EVAL_COMPILE_PER_STEP_COMPILE = 0.2


@dataclasses.dataclass(frozen=True)
class RunEnd:
    """What a run does beyond its training steps, as known before it starts: the ETA's estimates, each
    replaced by what the run measures once it has.

    Attributes:
      eval_every: eval_every_steps (0: the final evaluation only).
      eval_windows: the windows an evaluation reads (`heldout.heldout_windows`; 0: no heldout data, so
        no evaluations).
      eval_extra_s: an evaluation's seconds beyond its windows (the unigram model's pass, at the first).
      export_s: the seconds of the run's end beside its final evaluation: the export, mostly (with
        waiting for the last checkpoint and the process's exit).
    """

    eval_every: int = 0
    eval_windows: int = 0
    eval_extra_s: float = 0.0
    export_s: float = 0.0


class StepLine:
    """The console line: step, loss, perplexity, tokens/s, steps/s, ETA, written to absl's log by
    `runtime.progress.Progress` (measured in steps, rates over the time since the last line).

    Time that is not training (compiling the step, evaluations) is taken out of the rates (`exclude`),
    so tokens/s and steps/s are the training speed now. The ETA counts what is still to come
    (`still_due`): the steps left at the run's training speed (since it started, not since the last
    line: a window holding a checkpoint's write reads half as fast as the next), the training step's
    compiles still expected, every evaluation still due (the final one included) and the export.

    Measured on the README's demo (bench/eta_accuracy.py, a fresh clone, a quiet 2-core CPU; results in
    bench/results_eta_accuracy.json): the time left was 0.84-1.26x the printed ETA at every line, the first
    minute's included. A batch meeting a char CNN shape for the first time runs with a wider one already
    compiled (`batch_feed.step_shape`), so the demo's one batch of short words (step 585 of 600) no longer
    compiles the step unforeseen (1.6-1.7x at steps 550 and 575 before). Before this ETA, compiles, the
    final evaluation and the export were left out: 1.3-2.5x short mid-run, and "ETA 0 s" 13 s before the end.
    """

    def __init__(self, start_step: int, total_steps: int, sampled: bool, end: RunEnd = RunEnd()):
        self.total, self.end = total_steps, end
        # exp(sampled-softmax loss) is what bilm-tf logs as train perplexity; it is not the model's
        # perplexity (the sampled loss underestimates the full one), so the line says which it is.
        self.ppl_label = "ppl(sampled)" if sampled else "ppl"
        self.progress = Progress(
            {"steps": total_steps, "tokens": None}, start={"steps": start_step}, every_s=0, log=True, window=True
        )
        # The ETA's rate: over the whole run, written nowhere.
        self.run = Progress({"steps": total_steps}, start={"steps": start_step}, enabled=False)
        # Char CNN buckets (positions, distinct slots): steps whose batch needed each, since step 0; the
        # ones steps ran with, since step 0 (both kept in checkpoints: a resumed run chooses as the
        # uninterrupted one does); the ones this process compiled the training step for.
        self.shapes: collections.Counter = collections.Counter()
        self.run_shapes: set[tuple] = set()
        self.compiled_shapes: set[tuple] = set()
        self.compiles: list[float] = []  # seconds of each training step compile
        self.eval_compiles: dict[int, float] = {}  # an eval window's width -> its first window's seconds
        self.eval_windows: list[float] = []  # seconds of the other eval windows
        self.last_eval: tuple[int, float] | None = None  # (step, seconds less its compiles) of the last one

    def exclude(self, seconds: float) -> None:
        """`seconds` of the current window were not training (a compile, an evaluation)."""
        self.progress.exclude(seconds)
        self.run.exclude(seconds)

    def next_shape(self, needed: tuple) -> tuple[tuple, bool]:
        """The char CNN buckets the next step runs with, its batch needing `needed` (`batch_feed.step_shape`:
        a wider one already run with, for a shape met the first time), and whether this process compiles
        the training step for them first. How often new shapes are met is the ETA's forecast of compiles."""
        self.shapes[needed] += 1
        shape = step_shape(needed, self.shapes, self.run_shapes)
        self.run_shapes.add(shape)
        return shape, shape not in self.compiled_shapes

    def shape_record(self) -> dict:
        """The shapes met and run with, as a checkpoint keeps them (JSON: lists, None as null)."""
        return {
            "needed": [[*shape, count] for shape, count in sorted(self.shapes.items(), key=str)],
            "run": [list(shape) for shape in sorted(self.run_shapes, key=str)],
        }

    def restore_shapes(self, record: dict) -> None:
        """Takes back what `shape_record` wrote (a checkpoint's; {} from one of an older version)."""
        self.shapes.update({(p, d): int(n) for p, d, n in record.get("needed", [])})
        self.run_shapes.update((p, d) for p, d in record.get("run", []))

    def compiled(self, shape: tuple, seconds: float) -> None:
        """The training step compiled for `shape` in `seconds`: out of the rates, the cost of those to come."""
        self.exclude(seconds)
        self.compiled_shapes.add(shape)
        self.compiles.append(seconds)

    def eval_window(self, width: int, seconds: float) -> None:
        """A heldout window of char CNN width `width` took `seconds`; the first of its width compiled the
        eval step for it (`heldout.heldout_perplexity`'s `on_window`)."""
        if width in self.eval_compiles:
            self.eval_windows.append(seconds)
        else:
            self.eval_compiles[width] = seconds

    def evaluated(self, step: int, seconds: float) -> None:
        """The evaluation after `step` took `seconds` (its windows reported): out of the rates; what each
        still due costs is what it took less what is not done again: the first one's compiles and its
        unigram model's pass (as estimated: `RunEnd.eval_extra_s`)."""
        self.exclude(seconds)
        once = 0.0
        if self.last_eval is None:
            window = sum(self.eval_windows) / len(self.eval_windows) if self.eval_windows else 0.0
            once = sum(max(s - window, 0.0) for s in self.eval_compiles.values()) + self.end.eval_extra_s
        self.last_eval = (step, max(seconds - once, 0.0))

    def add_tokens(self, tokens: float) -> None:
        """`tokens` more were trained on (a step's)."""
        self.progress.add(tokens=tokens)

    def still_due(self, step: int) -> float:
        """Seconds still to come after `step` beyond its steps: compiles, evaluations, the export."""
        return self._compiles_due(step) + self._evaluations_due(step) * self._evaluation_s() + self.end.export_s

    def _compiles_due(self, step: int) -> float:
        """The training step's compiles expected in the steps left, at their measured mean cost.

        Shapes are met as the text needs them: most in the first steps, rare ones (a batch of short words
        only, one with a word of 48 characters) any time. As Good-Turing estimates, a step meets a shape
        not met yet with the chance of the shapes met once among the steps run; the steps left meet one
        with the chance 1 - (1 - p)^left, counted as one compile: a run met by a burst of new ones
        has met most of them by then, and forecasting each at p would count several times the
        compiles that come.
        """
        steps = sum(self.shapes.values())
        if not steps or not self.compiles:
            return 0.0
        once = sum(1 for n in self.shapes.values() if n == 1)
        chance = 1.0 - (1.0 - once / steps) ** max(self.total - step, 0)
        return chance * sum(self.compiles) / len(self.compiles)

    def _evaluations_due(self, step: int) -> int:
        """The evaluations still due after the line of `step`: the periodic ones not yet run (the one
        after `step` may run before or after its line) and the final one."""
        if not self.end.eval_windows:
            return 0
        every, done = self.end.eval_every, self.last_eval[0] if self.last_eval else -1
        if not every:
            return 1
        first = max(step, done + 1, 1)
        return len(range(-(-first // every) * every, self.total, every)) + 1

    def _evaluation_s(self) -> float:
        """One evaluation still due: the last one's seconds less what is not done again, or, before one ran, its
        windows at a share of the training step's time, a compile per character width training met at a
        share of the training step's compile, and its seconds beside the windows."""
        if self.last_eval is not None:
            return self.last_eval[1]
        rate = self.run.rate()
        step_s = 1.0 / rate if rate > 0 else 0.0
        compile_s = sum(self.compiles) / len(self.compiles) if self.compiles else 0.0
        widths = {shape[0] for shape in self.shapes}
        return (
            self.end.eval_windows * step_s * EVAL_WINDOW_PER_STEP
            + len(widths) * compile_s * EVAL_COMPILE_PER_STEP_COMPILE
            + self.end.eval_extra_s
        )

    def line(self, step: int, metrics: dict[str, float]) -> str:
        """Writes (and returns) the line of `step`; adds its rates to `metrics`; starts the next window."""
        progress = self.progress
        progress.add(steps=step - progress.done["steps"])
        self.run.add(steps=step - self.run.done["steps"])
        steps_per_s, tokens_per_s = progress.rate("steps"), progress.rate("tokens")
        eta = self.run.eta(still_due_s=self.still_due(step))
        metrics.update(tokens_per_s=tokens_per_s, steps_per_s=steps_per_s)
        line = (
            f"step {step}/{self.total}  loss {metrics['loss']:.4f}  "
            f"{self.ppl_label} {math.exp(min(metrics['loss'], 700)):.1f}"
            f"  {tokens_per_s:,.0f} tokens/s  {steps_per_s:.2f} steps/s  ETA {duration(eta)}"
        )
        progress.write(line)
        return line


class StepReport:
    """Reads, checks and logs each step's metrics.

    Args:
      config: the run's config (log_every_steps, num_train_steps, max_nonfinite_steps, full_softmax).
      log: where records go (disabled on processes other than 0).
      start_step: the step training starts or resumes from.
      saved: the progress its checkpoint kept (`saved`: non-finite steps skipped before `start_step`, the
        char CNN shapes met), or None.
      end: what the run does beyond its steps, for the ETA (evaluations, the export).
    """

    def __init__(self, config, log: MetricsLog, start_step: int, saved: dict | None = None, end: RunEnd = RunEnd()):
        saved = saved or {}
        self.config, self.log, self.skipped = config, log, int(saved.get("nonfinite_skipped", 0))
        self.progress = StepLine(start_step, config.num_train_steps, sampled=not config.full_softmax, end=end)
        self.progress.restore_shapes(saved.get("char_cnn_shapes", {}))

    def saved(self) -> dict:
        """What a checkpoint keeps of the run's progress (`progress` in its metadata); `saved` back."""
        return {"nonfinite_skipped": self.skipped, "char_cnn_shapes": self.progress.shape_record()}

    def __call__(self, step: int, metrics) -> None:
        """`metrics` of step `step` (device arrays): raises TrainingError for a non-finite step beyond
        the policy, logs on schedule (and every skipped step)."""
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self.progress.add_tokens(values["tokens"])
        was_skipped = values.pop("skipped", 0.0) > 0
        finite = math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])
        limit = self.config.max_nonfinite_steps
        if not finite:
            what = (
                f"non-finite loss or gradient at step {step} (loss {values['loss']}, grad norm {values['grad_norm']})"
            )
            if not (was_skipped and self.skipped < limit):
                beyond = (
                    f"; {self.skipped} such steps skipped already, the most --config.max_nonfinite_steps allows"
                    if limit
                    else ""
                )
                raise TrainingError(f"{what}{beyond}; stopped without saving it, the last checkpoint is kept")
            self.skipped += 1
            logging.warning(
                "%s: skipped, parameters and optimiser state unchanged (%d of at most %d skipped)",
                what,
                self.skipped,
                limit,
            )
        if limit:
            values["nonfinite_skipped"] = self.skipped
        if step % self.config.log_every_steps == 0 or step == self.config.num_train_steps or not finite:
            self.progress.line(step, values)  # written to the log; adds the rates to `values`
            self.log.write(step, values)


def last_logged_step(workdir: str) -> int | None:
    """The highest step of a train record in `WORKDIR/metrics.jsonl` (None without one).

    A last line cut short (the disk filled mid-write) is removed first, with a warning, so the file
    stays one JSON object per line.
    """
    data = storage.read_lines(storage.join(workdir, "metrics.jsonl"))
    if not data:
        return None
    steps = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # not ours to judge here; readers of the file report it
        if isinstance(record, dict) and record.get("kind") == "train":
            steps.append(int(record.get("step", 0)))
    return max(steps, default=None)


def log_resume(workdir: str, start: int, is_main: bool) -> dict:
    """Logs where training resumes and how many steps the interrupted run had done past it (its last
    logged step; metrics are logged one step late and every log_every_steps, so a few more may have
    run). Returns the resume record's fields: {"lost_steps": n}, or {"lost_steps_at_least": n} when the
    log may lag the run (a bucket's is uploaded every few seconds and before each checkpoint, so a
    killed run may have gone further than it shows), or {} (no metrics, or not process 0)."""
    last = last_logged_step(workdir) if is_main else None
    where = storage.join(workdir, "checkpoints", str(start))
    if last is None:
        logging.info("resumed from step %d (%s)", start, where)
        return {}
    lost = max(0, last - start)
    if storage.may_lag(storage.join(workdir, "metrics.jsonl")):
        logging.info(
            "resumed from step %d (%s); the interrupted run's metrics reach step %d, but in a bucket they are "
            "uploaded every %.0f s and before each checkpoint, so it may have run further: at least %d steps "
            "since it were lost, how many more is not known; they are done again",
            start,
            where,
            last,
            storage.append_log.UPLOAD_EVERY_S,
            lost,
        )
        return {"lost_steps_at_least": lost}
    logging.info(
        "resumed from step %d (%s); %d steps since it were lost (the interrupted run had logged up to "
        "step %d) and are done again",
        start,
        where,
        lost,
        last,
    )
    return {"lost_steps": lost}
