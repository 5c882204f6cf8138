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
