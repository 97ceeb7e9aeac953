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

import json
import math

import jax
from absl import logging

from elmo_jax import storage
from elmo_jax.runtime.progress import Progress, duration
from elmo_jax.training.metrics_log import MetricsLog


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the message says why and what is kept."""


class StepLine:
    """The console line: step, loss, perplexity, tokens/s, steps/s, ETA, written to absl's log by
    `runtime.progress.Progress` (measured in steps, rates over the time since the last line).

    Time that is not training (compiling the step, evaluations) is taken out of the rates (`exclude`),
    so tokens/s and steps/s are the training speed; the ETA is the steps left at that speed plus the
    evaluations still due, each as long as the last one (`evaluated`).
    """

    def __init__(self, start_step: int, total_steps: int, sampled: bool, eval_every: int = 0):
        self.total, self.eval_every = total_steps, eval_every
        # exp(sampled-softmax loss) is what bilm-tf logs as train perplexity; it is not the model's
        # perplexity (the sampled loss underestimates the full one), so the line says which it is.
        self.ppl_label = "ppl(sampled)" if sampled else "ppl"
        self.eval_seconds = 0.0
        self.progress = Progress(
            {"steps": total_steps, "tokens": None}, start={"steps": start_step}, every_s=0, log=True, window=True
        )

    def exclude(self, seconds: float) -> None:
        """`seconds` of the current window were not training (a compile, an evaluation)."""
        self.progress.exclude(seconds)

    def evaluated(self, seconds: float) -> None:
        """An evaluation took `seconds`: out of the rates, and the ETA's cost of each one still due."""
        self.exclude(seconds)
        self.eval_seconds = seconds

    def add_tokens(self, tokens: float) -> None:
        """`tokens` more were trained on (a step's)."""
        self.progress.add(tokens=tokens)

    def line(self, step: int, metrics: dict[str, float]) -> str:
        """Writes (and returns) the line of `step`; adds its rates to `metrics`; starts the next window."""
        progress = self.progress
        progress.add(steps=step - progress.done["steps"])
        steps_per_s, tokens_per_s = progress.rate("steps"), progress.rate("tokens")
        evals_left = (self.total // self.eval_every - step // self.eval_every) if self.eval_every else 0
        eta = progress.eta(still_due_s=evals_left * self.eval_seconds)
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
      skipped: non-finite steps skipped before `start_step` (from the checkpoint).
    """

    def __init__(self, config, log: MetricsLog, start_step: int, skipped: int = 0):
        self.config, self.log, self.skipped = config, log, skipped
        self.progress = StepLine(
            start_step, config.num_train_steps, sampled=not config.full_softmax, eval_every=config.eval_every_steps
        )

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
