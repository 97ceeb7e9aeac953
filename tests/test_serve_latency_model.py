"""bench/serve_latency_model.py's ideal batcher, on queues worked out by hand."""

import numpy as np
import pytest

from bench.serve_latency_model import poisson, simulate


def test_batches_take_what_waits_when_the_last_one_ends():
    # cost(k) = 0.1 + 0.05 k. Request 0 runs alone (0 -> 0.15); requests 1 and 2 arrived meanwhile and
    # run together (0.15 -> 0.35); request 3 arrives to an idle batcher (0.5 -> 0.65).
    latencies = simulate([0.0, 0.01, 0.02, 0.5], lambda k: 0.1 + 0.05 * k, max_requests=4)
    np.testing.assert_allclose(latencies, [0.15, 0.34, 0.33, 0.15], rtol=1e-12)


def test_a_batch_holds_at_most_max_requests():
    # Four arrive at once: three run (0 -> 0.25), the fourth after them (0.25 -> 0.40).
    latencies = simulate([0.0, 0.0, 0.0, 0.0], lambda k: 0.1 + 0.05 * k, max_requests=3)
    np.testing.assert_allclose(latencies, [0.25, 0.25, 0.25, 0.40], rtol=1e-12)


def test_a_flat_cost_bounds_latency_by_two_batches():
    # A batch costs 0.1 s whatever it holds and holds every waiting request: a request waits at most
    # for the batch running when it arrives, then for its own.
    latencies = simulate(poisson(50.0, 5000), lambda k: 0.1, max_requests=10**6)
    assert latencies.min() == pytest.approx(0.1) and latencies.max() <= 0.2 + 1e-12


def test_poisson_arrivals_have_the_rate():
    times = poisson(20.0, 20000, seed=3)
    assert np.all(np.diff(times) > 0)
    # The count in 1,000 s of a rate-20 process: 20,000 +- 3 standard deviations (sqrt(20,000) = 141).
    assert abs(20000 / times[-1] * 1000 - 20000) < 3 * 141
