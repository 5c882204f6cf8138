"""Request groups (groups.py) and their turns (queues.RoundRobin), vectorized, against a plain
reference: random groups of requests, batches taken under random budgets, answered out of order,
requests cancelled on the way. Every live request is answered once with exactly its own rows, a
cancelled one never, and every token counted against the queue cap comes back."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kembed.worker.classes import Priority
from kembed.worker.scheduling.groups import RequestGroup
from kembed.worker.scheduling.queues import RoundRobin


class Sink:
    def __init__(self) -> None:
        self.answered: dict[tuple[int, int], np.ndarray] = {}  # (group, request) -> rows
        self.failed: list[tuple[int, int]] = []

    def for_group(self, number: int):
        sink = self

        class Bound:
            def answered(self, group, requests) -> None:
                counts, rows = group.rows_of(requests)
                at = 0
                for request, count in zip(requests.tolist(), counts.tolist(), strict=True):
                    key = (number, request)
                    assert key not in sink.answered, f"{key} answered twice"
                    sink.answered[key] = rows[at : at + count]
                    at += count

            def failed(self, group, requests, error) -> None:
                sink.failed += [(number, r) for r in requests.tolist()]

        return Bound()


groups_strategy = st.lists(  # groups, each a list of requests, each a list of sequence lengths
    st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=4), min_size=1, max_size=6),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(
    groups=groups_strategy,
    budgets=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 8)), min_size=1, max_size=40),
    order=st.randoms(use_true_random=False),
    cancels=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5), st.integers(0, 40)), max_size=4),
)
def test_every_live_request_gets_exactly_its_rows_once(groups, budgets, order, cancels):
    sink = Sink()
    made: list[RequestGroup] = []
    expected: dict[tuple[int, int], np.ndarray] = {}
    queue = RoundRobin()
    for g, requests in enumerate(groups):
        lengths = np.array([n for request in requests for n in request], np.int32)
        # token id = 1000 * group + 10 * global sequence index + position: rows identify sequences
        ids, seq = [], 0
        for r, request in enumerate(requests):
            rows = []
            for n in request:
                first = 1000 * g + 10 * seq
                ids.append(np.arange(first, first + n, dtype=np.int32))
                rows.append([first, n])
                seq += 1
            expected[g, r] = np.array(rows, np.float32)
        counts = None if all(len(r) == 1 for r in requests) else np.array([len(r) for r in requests])
        group = RequestGroup(
            np.concatenate(ids),
            lengths,
            counts,
            sink.for_group(g),
            priority=Priority.INTERACTIVE,
            admitted_at=0.0,
        )
        made.append(group)
        queue.push(group)
    total_tokens = sum(g.num_queued_tokens for g in made)
    released = 0
    cancelled: set[tuple[int, int]] = set()
    in_flight: list[list] = []
    step = 0

    def deliver(batch) -> None:
        nonlocal released
        for seg in batch:
            group = seg.group
            ids = group.tokens_of(seg.seqs)
            starts = np.concatenate([[0], np.cumsum(group.lengths[seg.seqs])[:-1]]).astype(int)
            rows = np.stack([ids[starts], group.lengths[seg.seqs]], axis=1).astype(np.float32)
            done, freed = group.deliver(seg.seqs, rows)
            released += freed
            if len(done):
                group.sink.answered(group, done)

    while queue or in_flight:
        for g, r, at in cancels:
            if at == step and g < len(made) and r < made[g].num_requests:
                gone, freed = made[g].finish(np.array([r]))
                released += freed
                cancelled.update((g, int(x)) for x in gone.tolist())
        max_tokens, max_sequences = budgets[step % len(budgets)]
        batch = queue.take(max_tokens, max_sequences)
        if batch:
            num_seqs = sum(len(seg.seqs) for seg in batch)
            num_tokens = sum(seg.num_tokens for seg in batch)
            assert num_seqs <= max_sequences and (num_tokens <= max_tokens or num_seqs == 1)
            in_flight.append(batch)
        if in_flight and (len(in_flight) >= 3 or not batch):  # answered in any order
            deliver(in_flight.pop(order.randrange(len(in_flight))))
        step += 1
        assert step < 10_000
    for g, group in enumerate(made):
        for r in range(group.num_requests):
            if (g, r) in cancelled:
                assert (g, r) not in sink.answered
            else:
                np.testing.assert_array_equal(sink.answered[g, r], expected[g, r])
        assert group.num_queued_tokens == 0 and group.num_live == 0
    assert released == total_tokens


@settings(max_examples=200, deadline=None)
@given(
    requests=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=8),
    answered=st.data(),
)
def test_rows_of_any_answered_requests_are_their_rows_back_to_back(requests, answered):
    lengths = np.array([n for request in requests for n in request], np.int32)
    group = RequestGroup(
        np.zeros(int(lengths.sum()), np.int32), lengths, np.array([len(r) for r in requests]),
        Sink().for_group(0), priority=Priority.BULK, admitted_at=0.0,
    )  # fmt: skip
    group.rows = np.arange(len(lengths) * 2, dtype=np.float32).reshape(-1, 2)  # row s: [2s, 2s + 1]
    chosen = sorted(answered.draw(st.sets(st.integers(0, len(requests) - 1), min_size=1)))
    counts, rows = group.rows_of(np.array(chosen))
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in requests])])
    assert counts.tolist() == [len(requests[r]) for r in chosen]
    want = np.concatenate([group.rows[offsets[r] : offsets[r + 1]] for r in chosen])
    np.testing.assert_array_equal(rows, want)
