"""``ImageUploads.read`` (runtime/host_threads.py): bytes of an image's uploads by BO and
offset, also across a buffer uploaded in adjacent pieces (lowering/weight_spans.py), and None
where a byte is not uploaded."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from rockjit.runtime.host_threads import ImageUploads
from rockjit.runtime.image import Upload


def test_reads_across_adjacent_pieces_and_refuses_gaps() -> None:
    data = np.arange(100, dtype=np.uint8)
    arrays = {"a": data[0:40], "b": data[40:70], "c": data[80:100]}
    image = SimpleNamespace(arrays=arrays, uploads=[Upload(3, 1000, "b"), Upload(3, 960, "a"),
                                                    Upload(3, 1040, "c")])
    ups = ImageUploads(image)
    assert ups.read(3, 970, 10) == data[10:20].tobytes()
    assert ups.read(3, 990, 30) == data[30:60].tobytes()      # across pieces a and b
    assert ups.read(3, 960, 70) == data[0:70].tobytes()
    assert ups.read(3, 1025, 10) is None                       # runs into the gap at 1030
    assert ups.read(3, 950, 4) is None                         # before the first upload
    assert ups.read(3, 1040, 20) == data[80:100].tobytes()
    assert ups.read(3, 1050, 20) is None                       # past the last one
    assert ups.read(4, 960, 4) is None                         # another BO
