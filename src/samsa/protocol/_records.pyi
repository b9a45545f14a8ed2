import numpy as np

class RecordError(ValueError): ...

def walk(
    buf: bytes,
    pos: int,
    end: int,
    first: int,
    room: int,
    ts_out: np.ndarray | None = ...,
    null_out: np.ndarray | None = ...,
    /,
) -> tuple[int, int, int, int, int]: ...
