"""UnitBuffer: exact 16000-sample units whatever the append sizes; commit pads the residual."""
import numpy as np

from backends.duplex.unit_buffer import UnitBuffer


def test_units_are_cut_exactly_across_uneven_appends():
    buf = UnitBuffer()
    pcm = (np.arange(40000) % 1000).astype(np.int16)
    units = []
    for size in (3200, 100, 16000, 7, 20693):
        chunk, pcm = pcm[:size], pcm[size:]
        units += buf.push(chunk)
    assert len(units) == 2 and all(u.shape == (16000,) and u.dtype == np.float32 for u in units)
    assert buf.num_pending == 40000 - 32000
    expected = (np.arange(40000) % 1000).astype(np.float32) / 32768.0
    np.testing.assert_array_equal(np.concatenate(units), expected[:32000])


def test_commit_pads_the_residual_to_one_unit_and_empties_the_buffer():
    buf = UnitBuffer()
    buf.push(np.full(5000, 16384, np.int16))
    unit = buf.flush_padded()
    assert unit.shape == (16000,) and unit[:5000].max() == 0.5 and not unit[5000:].any()
    assert buf.flush_padded() is None and buf.num_pending == 0
