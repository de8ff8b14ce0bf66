"""Finishing OpenCL programs in PTX: Hopper instructions NVIDIA's OpenCL cannot emit.

NVIDIA's OpenCL compiles for ``sm_90``; ``wgmma`` and its fences exist only
for ``sm_90a``, and ptxas refuses them in inline assembly there.  The
program binary NVIDIA's OpenCL returns is PTX text, and a PTX text
retargeted to ``sm_90a`` loads back through ``clCreateProgramWithBinary``.
So a kernel marks where such instructions go with *sites* — inline PTX that
the ``sm_90`` build accepts — and :func:`finish` replaces them:

- a site starts with ``add.u32 %rN, %rN, NUMBER;`` (``NUMBER`` says which
  :class:`Site` it is; the register is a dummy);
- it is followed by one identity ``mov`` per register the instruction
  needs (``mov.b64 %rd7, %rd7;`` for a descriptor, ``mov.f32 %f9, %f9;``
  for an accumulator), in the order the instruction takes them, so the
  compiler has named the registers and kept the values live there.

Every edit is checked: a site that is not where or what it should be
raises :class:`PtxEditError`, and the caller keeps the kernels it had.

The finished PTX is kept on disk (:func:`cached_program`, through
:mod:`dgemm.opencl.binaries`), as pyopencl keeps the programs it builds from
source: a new worker process loads it instead of building, editing and
building again.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from dgemm.errors import PtxEditError
from dgemm.opencl import binaries

__all__ = ["PtxEditError", "Site", "cached_program", "finish", "program_ptx", "retarget"]


@dataclass(frozen=True)
class Site:
    """What replaces one kind of site.

    Parameters
    ----------
    text : str
        PTX put in; ``{0}``, ``{1}``, ... are the marked registers in order,
        ``{regs}`` all of them from ``first_list`` on, as a ``{...}`` vector.
    marks : sequence of str
        The marks that follow the site's number, by type (``"b64"``,
        ``"f32"``): how many registers it names and of which kind.
    at : str
        ``"number"`` to put ``text`` where the number is, ``"last"`` where
        the last mark is: where every marked register holds the value the
        instruction reads (the compiler may copy values into the marked
        registers between the marks).
    first_list : int
        Index of the first register that goes into ``{regs}``.
    why : str
        What the instruction is for (it ends up in the PTX as a comment).
    group : str
        Sites of one group must name the same registers from ``group_from``
        on, in every occurrence: the accumulators an asynchronous instruction
        writes stay where the next one, and the wait, expect them (a copy
        between two would read a value still being written).
    group_from : int
        Index of the first register the group compares.
    """

    text: str
    marks: Sequence[str] = field(default_factory=tuple)
    at: str = "number"
    first_list: int = 0
    why: str = ""
    group: str = ""
    group_from: int = 0


_ASM_BEGIN, _ASM_END = "// begin inline asm", "// end inline asm"
_NUMBER = re.compile(r"^add\.u32\s+(%r\d+),\s*\1,\s*(\d+);$")
_MARK = re.compile(r"^mov\.(b64|f32)\s+(%\w+),\s*\2;$")
_REG = re.compile(r"%[a-z]+\d+\b")
_TARGET = re.compile(r"^(\s*\.target\s+)sm_(\d+)a?\b", re.M)
# A label or a jump: a site's marks must all lie in one straight run of code.
_FLOW = re.compile(r"^(\$?[\w.]+:|(@!?%\w+\s+)?(bra|brx|ret|exit|call)\b)")


def program_ptx(program, device=None) -> str:
    """The PTX text of a built pyopencl program (NVIDIA's OpenCL returns PTX as the binary)."""
    import pyopencl as cl

    devices = program.get_info(cl.program_info.DEVICES)
    binaries = program.get_info(cl.program_info.BINARIES)
    binary = binaries[devices.index(device) if device is not None else 0]
    text = bytes(binary).rstrip(b"\0").decode("ascii", errors="replace")
    if ".target" not in text or ".entry" not in text:
        raise PtxEditError("the device's program binary is not PTX text (not NVIDIA's OpenCL?)")
    return text


def retarget(ptx: str, target: str = "sm_90a") -> str:
    """``ptx`` for ``target`` (e.g. ``sm_90a``: the architecture-specific features of sm_90)."""
    out, n = _TARGET.subn(lambda m: m.group(1) + target, ptx, count=1)
    if n != 1:
        raise PtxEditError("no .target line in the PTX")
    return out


def _asm_blocks(lines: list[str]):
    """(begin, end, text) of each inline-asm block: the lines between the compiler's markers."""
    i = 0
    while i < len(lines):
        if lines[i].strip() == _ASM_BEGIN:
            j = i + 1
            while j < len(lines) and lines[j].strip() != _ASM_END:
                j += 1
            if j == len(lines):
                raise PtxEditError(f"inline asm opened at line {i + 1} never closes")
            yield i, j, " ".join(s.strip() for s in lines[i + 1:j]).strip()
            i = j + 1
        else:
            i += 1


def finish(ptx: str, sites: Mapping[int, Site], target: str | None = "sm_90a") -> str:
    """Replace every site of ``ptx`` by its instruction; retarget to ``target`` (None: keep).

    Parameters
    ----------
    ptx : str
        The PTX the OpenCL compiler returned (:func:`program_ptx`).
    sites : mapping of int to Site
        What each site number stands for.
    target : str or None
        The ``.target`` to give the result.

    Returns
    -------
    str
        The PTX to load with ``clCreateProgramWithBinary``.

    Raises
    ------
    PtxEditError
        When a site's number is unknown, a site's marks are missing or of
        the wrong kind, or (``at="last"``) an instruction between the marks
        touches a register already marked, so the values the instruction
        would read are not where the marks say.  Also when no site at all
        is found: a kernel that was meant to be edited and was not would
        compute nothing.
    """
    lines = ptx.splitlines()
    blocks = list(_asm_blocks(lines))
    drop: set[int] = set()
    put: dict[int, list[str]] = {}
    groups: dict[str, tuple[list[str], int]] = {}
    done = 0
    b = 0
    while b < len(blocks):
        begin, end, text = blocks[b]
        m = _NUMBER.match(text)
        if not m:
            b += 1
            continue
        number = int(m.group(2))
        if number not in sites:
            raise PtxEditError(f"line {begin + 1}: unknown site {number}")
        site = sites[number]
        number_block = blocks[b]
        regs, mark_blocks = [], []
        for kind in site.marks:
            b += 1
            if b >= len(blocks):
                raise PtxEditError(f"site {number} at line {begin + 1}: the PTX ends before its marks")
            mb = _MARK.match(blocks[b][2])
            if not mb or mb.group(1) != kind:
                raise PtxEditError(f"site {number} at line {begin + 1}: expected a {kind} mark at line "
                                   f"{blocks[b][0] + 2}, found {blocks[b][2]!r}")
            regs.append(mb.group(2))
            mark_blocks.append(blocks[b])
        if len(set(regs)) != len(regs):
            raise PtxEditError(f"site {number} at line {begin + 1}: a register is marked twice")
        if mark_blocks:
            _check_straight(lines, begin, mark_blocks[-1][0], number)
        if site.group:
            named = regs[site.group_from:]
            first = groups.setdefault(site.group, (named, begin))
            if named != first[0]:
                raise PtxEditError(f"site {number} at line {begin + 1} names other {site.group} registers than "
                                   f"the site at line {first[1] + 1}: the compiler moved them in between")
        where = begin
        if site.at == "last" and mark_blocks:
            where = mark_blocks[-1][0]
            _check_untouched(lines, mark_blocks, regs, number)
        for blk in [number_block] + mark_blocks:
            drop.update(range(blk[0], blk[1] + 1))
        vector = "{" + ", ".join(regs[site.first_list:]) + "}"
        body = site.text.format(*regs, regs=vector)
        put[where] = [f"\t// dgemm site {number}: {site.why}"] + ["\t" + s for s in body.splitlines()]
        done += 1
        b += 1
    if not done:
        raise PtxEditError("no sites found in the PTX")
    out = []
    for i, line in enumerate(lines):
        if i in put:
            out.extend(put[i])
        if i not in drop:
            out.append(line)
    text = "\n".join(out) + "\n"
    return retarget(text, target) if target else text


def _check_straight(lines: list[str], first: int, last: int, number: int) -> None:
    """No label or jump between a site's number and its last mark."""
    for i in range(first, last):
        s = lines[i].strip()
        if _FLOW.match(s):
            raise PtxEditError(f"site {number}: line {i + 1} ({s!r}) is a label or a jump between its marks")


def _check_untouched(lines: list[str], mark_blocks, regs: list[str], number: int) -> None:
    """No instruction between a register's mark and the last mark may use that register."""
    first = mark_blocks[0][0]
    last = mark_blocks[-1][0]
    marked: set[str] = set()
    mark_at = {blk[0]: reg for blk, reg in zip(mark_blocks, regs)}
    in_mark = False
    for i in range(first, last):
        s = lines[i].strip()
        if i in mark_at:
            marked.add(mark_at[i])
            in_mark = True
            continue
        if s == _ASM_END:
            in_mark = False
            continue
        if in_mark or not s or s.startswith("//"):
            continue
        used = set(_REG.findall(s)) & marked
        if used:
            raise PtxEditError(f"site {number}: line {i + 1} ({s!r}) uses {sorted(used)} between the marks")


def device_identity(device) -> dict:
    """What of ``device`` (a pyopencl.Device) decides the program built for it: name, driver, platform."""
    return {"name": device.name, "vendor": device.vendor, "driver": device.driver_version,
            "version": device.version, "platform": device.platform.version}


def files_digest(paths) -> str:
    """SHA-256 over the names and contents of ``paths`` (sorted): the sources a program is built from."""
    h = hashlib.sha256()
    for p in sorted(Path(p) for p in paths):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cached_program(ctx, device, build: Callable[[], tuple], **parts):
    """A program finished through this module, from the disk cache when built there before.

    Parameters
    ----------
    ctx, device : pyopencl.Context, pyopencl.Device
        Where the program is for.
    build : callable
        Builds it the whole way: ``(program, finished PTX text)`` (as
        :func:`dgemm.opencl.wgmma.build` gives them first and last).
    **parts
        What else determines the finished PTX (JSON-able): the sources'
        digest (:func:`files_digest`), the compiler options, the sites'
        code.  The device and its driver (:func:`device_identity`), dgemm's
        and pyopencl's versions and this module's own text are added.

    Returns
    -------
    (pyopencl.Program, bool)
        The built program, and whether its PTX came from the cache.  An
        entry that is damaged, or that the driver does not build, is
        dropped and the program built again (:func:`dgemm.opencl.binaries.cached`).
    """
    import pyopencl as cl

    import dgemm

    entry = binaries.key(**parts, device=device_identity(device), dgemm=dgemm.__version__,
                         pyopencl=cl.VERSION_TEXT, editor=files_digest([__file__]))

    def make():
        program, finished = build()
        return program, finished.encode() + b"\0"

    def load(data: bytes):
        if not data.endswith(b"\0") or b".target" not in data:
            raise PtxEditError("a cached entry that is not finished PTX")
        return cl.Program(ctx, [device], [data]).build()

    return binaries.cached(entry, make, load)
