"""The data port's framing: frames survive any split of the byte stream; an oversized one is refused."""

import random

import pytest

from kembed.proto.framing import FrameError, FrameReader, frame


@pytest.mark.parametrize("seed", [0, 1, 2], ids=["split-0", "split-1", "split-2"])
def test_frames_come_back_whole_and_in_order_whatever_the_pieces(seed):
    rng = random.Random(seed)
    bodies = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))) for _ in range(50)]
    stream = b"".join(frame(body) for body in bodies)
    reader, received, at = FrameReader(1 << 10), [], 0
    while at < len(stream):  # pieces of 1 to 97 bytes: inside a length, across frames
        step = rng.randrange(1, 98)
        received += reader.feed(stream[at : at + step])
        at += step
    assert received == bodies


def test_a_frame_over_the_limit_is_refused_from_its_length_alone():
    reader = FrameReader(100)
    assert reader.feed(frame(b"x" * 100)) == [b"x" * 100]
    with pytest.raises(FrameError, match="101 bytes is over the limit of 100"):
        reader.feed(frame(b"y" * 101)[:4])  # only the length has arrived


@pytest.mark.parametrize("seed", [0, 1], ids=["rows-0", "rows-1"])
def test_a_result_frame_written_in_pieces_reads_back_whole_and_its_rows_as_a_view(seed):
    import numpy as np

    from kembed.proto import embedder_pb2 as pb
    from kembed.proto.framing import result_frame, split_rows

    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((int(rng.integers(1, 70)), 1024)).astype("<f4")
    ids = np.arange(len(rows), dtype="<u8")
    head = pb.ResultFrame(ids=ids.tobytes(), width=1024)
    head.errors.add(ids=np.array([99], "<u8").tobytes(), code=4, message="late")
    stream = b"".join(
        bytes(piece) for piece in result_frame(head.SerializeToString(), memoryview(rows).cast("B"))
    )
    [body] = FrameReader(1 << 24).feed(stream)
    whole = pb.ResultFrame.FromString(bytes(body))  # a valid ResultFrame, for any reader
    assert np.frombuffer(whole.rows, "<f4").tolist() == rows.ravel().tolist()
    rest, taken = split_rows(body)
    assert taken is not None and bytes(taken) == rows.tobytes()
    parsed = pb.ResultFrame.FromString(bytes(rest))
    assert parsed.width == 1024 and parsed.ids == ids.tobytes() and parsed.errors[0].message == "late"
    assert not parsed.rows
    # a frame whose rows field is not last is read whole
    other = pb.ResultFrame(rows=rows.tobytes(), ids=ids.tobytes(), width=1024).SerializeToString()
    rest, taken = split_rows(other)
    assert taken is None and bytes(rest) == other


def test_a_frame_over_the_limit_in_the_buffered_part_is_refused_and_the_reader_cleared():
    reader = FrameReader(100)
    assert reader.feed(frame(b"a" * 10)[:6]) == []  # a frame begun, buffered
    with pytest.raises(FrameError):
        reader.feed(frame(b"a" * 10)[6:] + frame(b"b" * 500)[:4])
