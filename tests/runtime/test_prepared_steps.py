"""Host-op steps are resolved, checked and planned once per load (rj_program_load ->
prepare_host_steps) and only walked per run. A write to a BO that holds a descriptor makes the
next run prepare again, so a rewritten descriptor takes effect; one that is no longer valid
fails that run with the unprepared path's message. References: numpy."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering.host_rules import HostView, encode_descriptor
from rockjit.runtime import NullDevice, Operand, ProgramBuilder, host_steps
from rockjit.runtime.errors import AddressError, ProgramError

F32 = DType.F32


def _copy_desc(in_stride: int, in_offset: int = 0) -> np.ndarray:
    """Copy 16 f32 into a dense [16] output from input elements in_offset + i * in_stride."""
    return encode_descriptor("copy", (16,), [HostView("o", F32, 0, (1,)),
                                            HostView("i", F32, in_offset, (in_stride,))], 0, 0, ())


def _program(dev):
    b = ProgramBuilder(dev)
    src, dst, desc = b.add_bo(64 * 4, "io"), b.add_bo(16 * 4, "io"), b.add_bo(512, "weights")
    b.upload(desc, _copy_desc(1))
    b.add_host_step(host_steps.HOST_STEPS["copy"](dst=Operand(dst), src=Operand(src),
                                                  desc=Operand(desc)))
    return b.build(), src, dst, desc


def test_a_rewritten_descriptor_takes_effect_on_the_next_run():
    x = np.arange(64, dtype=np.float32) * 1.5
    with NullDevice() as dev:
        p, src, dst, desc = _program(dev)
        p.write(src, x)
        p.run()
        np.testing.assert_array_equal(p.read_array(dst, np.float32, (16,)), x[:16])
        p.write(desc, _copy_desc(3, 5))          # every third element from 5, after load
        p.run()
        np.testing.assert_array_equal(p.read_array(dst, np.float32, (16,)), x[5::3][:16])
        p.write(src, -x)                          # an input write alone keeps the plan
        p.run()
        np.testing.assert_array_equal(p.read_array(dst, np.float32, (16,)), -x[5::3][:16])
        p.close()


def test_a_descriptor_overwritten_with_garbage_fails_the_run_naming_it():
    with NullDevice() as dev:
        p, src, dst, desc = _program(dev)
        p.run()
        p.write(desc, np.zeros(16, np.uint8))
        with pytest.raises(ProgramError, match="no host-op descriptor"):
            p.run()
        p.write(desc, _copy_desc(2))              # valid again: runs again
        x = np.arange(64, dtype=np.float32)
        p.write(src, x)
        p.run()
        np.testing.assert_array_equal(p.read_array(dst, np.float32, (16,)), x[::2][:16])
        p.close()


def test_a_descriptor_reaching_past_its_buffer_after_a_rewrite_is_refused():
    with NullDevice() as dev:
        p, src, dst, desc = _program(dev)
        p.run()
        p.write(desc, _copy_desc(5))              # 15 * 5 = element 75 of a 64-element BO
        with pytest.raises(AddressError, match="reaches element 75"):
            p.run()
        p.close()


def test_a_descriptor_a_step_writes_during_the_run_is_read_when_its_step_runs():
    """A host step that writes another step's descriptor BO: that step is not prepared (its
    descriptor can change within a run) and runs with the bytes written before it."""
    x = np.arange(64, dtype=np.float32) * 0.5
    new = _copy_desc(3, 5)
    with NullDevice() as dev:
        b = ProgramBuilder(dev)
        src, dst = b.add_bo(64 * 4, "io"), b.add_bo(16 * 4, "io")
        desc, staged, mover = b.add_bo(512, "weights"), b.add_bo(512, "io"), b.add_bo(512, "weights")
        b.upload(desc, _copy_desc(1))
        b.upload(staged, new)
        b.upload(mover, encode_descriptor("copy", (new.nbytes,), [HostView("o", DType.U8, 0, (1,)),
                                                                  HostView("i", DType.U8, 0, (1,))],
                                          0, 0, ()))
        b.add_host_step(host_steps.HOST_STEPS["copy"](dst=Operand(desc), src=Operand(staged),
                                                      desc=Operand(mover)))
        b.add_host_step(host_steps.HOST_STEPS["copy"](dst=Operand(dst), src=Operand(src),
                                                      desc=Operand(desc)))
        p = b.build()
        p.write(src, x)
        for _ in range(2):
            p.run()
            np.testing.assert_array_equal(p.read_array(dst, np.float32, (16,)), x[5::3][:16])
        p.close()
