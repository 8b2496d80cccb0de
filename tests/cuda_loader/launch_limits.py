#!/usr/bin/python3
"""Every CUDA kernel of the built module fits its launch: threads x registers within an SM's
register file, and no more threads than its __launch_bounds__. A kernel that needs more
registers than its block can have fails to launch ("too many resources requested"), on the
first GPU run, which CI cannot see; this reads what nvcc built, without a GPU.

    launch_limits.py MODULE.so KERNELS_DIR

From the module: the sm_90 cubins its fat binary embeds (uncompressed ELF images), each
kernel's register count (the .nv.info section's EIATTR_REGCOUNT, by the kernel's symbol) and
its launch bound (EIATTR_MAX_THREADS in its own .nv.info.NAME, present with
__launch_bounds__). From the sources (kernels/cuda/*.cu): each kernel's launches, `name<<<grid,
THREADS` with THREADS an integer, a constant of the file or of common.cuh, a dim3 of constants,
or a std::clamp(..., lo, hi) variable (its hi). A kernel launched only through a generic launch
in its file (activation.cu's `kernel<<<...`) takes that launch's threads. A kernel of the
module with no launch found fails the check: its launch must be one this script can read.
Exit 0, or 1 listing each problem.
"""
import re
import struct
import subprocess
import sys

REGISTERS_PER_SM = 65536   # sm_90: per block as well
ALLOCATION_UNIT = 256      # registers are given to a warp in units of 256
EIATTR_MAX_THREADS, EIATTR_REGCOUNT = 0x05, 0x2F


def cubins(blob):
    """The 64-bit ELF images inside the module (the first is the module itself)."""
    at = blob.find(b"\x7fELF", 1)
    while at != -1:
        if blob[at + 4] == 2 and blob[at + 18:at + 20] == struct.pack("<H", 190):  # EM_CUDA
            yield blob[at:]
        at = blob.find(b"\x7fELF", at + 1)


def attributes(elf, off, size):
    """EIATTR entries of an .nv.info section: (attribute, bytes)."""
    p, end = off, off + size
    while p < end:
        fmt, attr = elf[p], elf[p + 1]
        p += 2
        if fmt == 4:  # EIFMT_SVAL: a u16 size, then the value
            (n,) = struct.unpack_from("<H", elf, p)
            yield attr, elf[p + 2:p + 2 + n]
            p += 2 + n
        elif fmt == 3:  # EIFMT_HVAL
            yield attr, elf[p:p + 2]
            p += 2
        elif fmt == 2:  # EIFMT_BVAL
            yield attr, elf[p:p + 1]
            p += 1


def kernels_of(elf):
    """{mangled kernel name: (registers, max threads or None)} of one cubin."""
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + k * shentsize) for k in range(shnum)]
    strtab = secs[shstrndx][4]

    def name(o):
        return elf[strtab + o:elf.index(b"\0", strtab + o)].decode()

    regs_by_symbol, bounds, text_symbol = {}, {}, {}
    for s in secs:
        n, off, size, info = name(s[0]), s[4], s[5], s[7]
        if n == ".nv.info":
            for attr, v in attributes(elf, off, size):
                if attr == EIATTR_REGCOUNT:
                    sym, regs = struct.unpack_from("<II", v)
                    regs_by_symbol[sym] = regs
        elif n.startswith(".nv.info."):
            for attr, v in attributes(elf, off, size):
                if attr == EIATTR_MAX_THREADS:
                    x, y, z = struct.unpack_from("<III", v)
                    bounds[n[len(".nv.info."):]] = x * max(y, 1) * max(z, 1)
        elif n.startswith(".text."):
            text_symbol[n[len(".text."):]] = info  # sh_info: the kernel's symbol index
    return {k: (regs_by_symbol.get(sym), bounds.get(k)) for k, sym in text_symbol.items()}


def qualified_name(demangled):
    """void strata::cuda::(anonymous namespace)::relayout_kernel<int, true>(float*, ...) ->
    strata::cuda::anonymous::relayout_kernel (template arguments and parameters dropped)."""
    text = demangled.replace("(anonymous namespace)", "anonymous")
    depth, out = 0, ""
    for c in text:
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            break
        elif depth == 0:
            out += c
    return out.split(" ")[-1]


def resolve(expr, text, common):
    """The largest thread count a launch's block expression can take, or None."""
    expr = expr.strip()
    if re.fullmatch(r"\d+", expr):
        return int(expr)
    name = expr.split("::")[-1]
    for src in (text, common):
        m = re.search(r"constexpr int (?:\w+ = \d+, )*" + name + r" = (\d+)", src)
        if m:
            return int(m.group(1))
        m = re.search(r"\b" + name + r" = std::clamp\((.*), (\w+)\);", src)
        if m:
            return resolve(m.group(2), text, common)
        m = re.search(r"dim3 [^;]*\b" + name + r"\(([^()]*)\)", src)
        if m:
            dims = [resolve(d, text, common) for d in m.group(1).split(",")]
            if all(dims):
                n = 1
                for d in dims:
                    n *= d
                return n
    m = re.fullmatch(r"dim3\((.*)\)", expr)
    return None if not m else None


def launches(src_dir, common):
    """{kernel base name: largest threads per block launched}, and per file the generic ones."""
    import glob
    import os
    direct, generic = {}, {}
    for path in sorted(glob.glob(os.path.join(src_dir, "*.cu"))):
        text = open(path, encoding="utf-8").read()
        for m in re.finditer(r"(\w+)\s*(?:<[^<>;]*>)?\s*<<<\s*((?:[^,()]|\([^()]*(?:\([^()]*\))?[^()]*\))+),\s*([^,>]+)", text):
            kernel, threads = m.group(1), resolve(m.group(3), text, common)
            key = os.path.basename(path)
            if kernel == "kernel":
                generic[key] = max(generic.get(key, 0), threads or 0) if threads else None
            else:
                direct[kernel] = max(direct.get(kernel, 0), threads) if threads else None
    return direct, generic


def regs_for_block(regs, threads):
    warps = (threads + 31) // 32
    per_warp = -(-regs * 32 // ALLOCATION_UNIT) * ALLOCATION_UNIT
    return warps * per_warp


def main():
    module, src_dir = sys.argv[1], sys.argv[2]
    blob = open(module, "rb").read()
    common = open(f"{src_dir}/common.cuh", encoding="utf-8").read()
    direct, generic = launches(src_dir, common)
    found = {}
    for elf in cubins(blob):
        found.update(kernels_of(elf))
    if not found:
        sys.exit("FAIL: no sm_90 cubin with kernels in the module (compressed fat binary?)")
    names = subprocess.run(["c++filt"], input="\n".join(found), capture_output=True, text=True,
                           check=True).stdout.splitlines()
    problems = []
    for (mangled, (regs, bound)), demangled in zip(found.items(), names):
        qualified = qualified_name(demangled)
        base = qualified.split("::")[-1]
        if not qualified.startswith("strata::"):
            # A library's kernel (CUB's radix sort, under the embedding's backward): CUB picks
            # its block size from its tuning policy and launches it itself; listed, not judged.
            print(f"{qualified:40s} {regs:4d} registers (a library's kernel: its own launch)")
            continue
        file_of = re.search(r"_GLOBAL__N__\w+?_\d+_(\w+?)_cu_", mangled)
        threads = direct.get(base)
        if threads is None and file_of:
            threads = generic.get(file_of.group(1) + ".cu")
        if regs is None:
            problems.append(f"{base}: no register count in the cubin")
            continue
        if not threads:
            problems.append(f"{base}: no launch of it found in {src_dir} (or its block size is "
                            "not one this check can read)")
            continue
        need = regs_for_block(regs, threads)
        verdict = "ok"
        if need > REGISTERS_PER_SM:
            problems.append(f"{base}: {threads} threads x {regs} registers = {need} > "
                            f"{REGISTERS_PER_SM}: the launch fails (add __launch_bounds__({threads}))")
            verdict = "TOO MANY"
        if bound and threads > bound:
            problems.append(f"{base}: launched with {threads} threads, __launch_bounds__({bound})")
            verdict = "OVER BOUND"
        print(f"{base:40s} {regs:4d} registers x {threads:5d} threads = {need:6d} of "
              f"{REGISTERS_PER_SM}{f'  (bound {bound})' if bound else ''}  {verdict}")
    for p in problems:
        print("FAIL: " + p)
    print(f"{len(found)} kernels checked: {'every launch fits' if not problems else f'{len(problems)} problems'}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
