#!/usr/bin/env python3
"""How much of a firmware's .text comes from nodeipam-core, counting code inlined elsewhere.

Usage: footprint.py ELF [CORE_SRC_DIR]

Every instruction (and literal-pool word) of .text is attributed with the DWARF line table
(GNU addr2line -i: the chain of inlined frames at that address) to the nearest frame, from the
innermost outwards, whose source file is the project's own: the core (CORE_SRC_DIR, default
../../core/src next to this script) or the example (src/ next to this script). Frames in the Rust
standard library or other crates are skipped, so a `u128` shift or a bounds check that core code
inlined counts for the core, and the agent's closure inlined into `SharedPool::with` counts for
the agent. Bytes with no project frame at all are "std and crates" (formatting, the executor,
compiler-builtins, cortex-m-rt).

Prints the section sizes (size -A), the attribution, the core's bytes per source file, and the
non-inlined nodeipam_core symbols (nm). Only the source locations of the inline chain are used:
GNU addr2line's function names for inlined frames are not reliable for rustc's DWARF. Needs
llvm-objdump (any version that reads Thumb-2) and GNU binutils (addr2line, nm, size). Build the
firmware with debug info (the release profile here has debug = 2).
"""

import collections
import os
import re
import subprocess
import sys


def run(*args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, text=True, check=True).stdout


def text_instructions(elf):
    """(address, size) of every instruction and data word in .text, from llvm-objdump."""
    addresses = []
    for line in run("llvm-objdump", "-d", "--no-show-raw-insn", "--section=.text", elf).splitlines():
        match = re.match(r"^\s+([0-9a-f]+):", line)
        if match:
            addresses.append(int(match.group(1), 16))
    sections = run("size", "-A", "-d", elf)
    text = re.search(r"^\.text\s+(\d+)\s+(\d+)", sections, re.M)
    end = int(text.group(2)) + int(text.group(1))
    addresses.sort()
    return [(a, (addresses[i + 1] if i + 1 < len(addresses) else end) - a)
            for i, a in enumerate(addresses)]


def inline_chains(elf, addresses):
    """address -> [(function, file)] innermost first, from GNU addr2line -a -i -f -C."""
    out = run("addr2line", "-a", "-i", "-f", "-C", "-e", elf,
              stdin="".join(f"{a:#x}\n" for a in addresses))
    chains, current, lines = {}, None, out.splitlines()
    i = 0
    while i < len(lines):
        if re.match(r"^0x[0-9a-f]+$", lines[i]):
            current = int(lines[i], 16)
            chains[current] = []
            i += 1
            continue
        function, location = lines[i], lines[i + 1] if i + 1 < len(lines) else "??:0"
        chains[current].append((function, location.rsplit(":", 1)[0]))
        i += 2
    return chains


def main():
    elf = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    core_src = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else
                               os.path.join(here, "..", "..", "core", "src")) + os.sep
    example_src = os.path.join(here, "src") + os.sep

    print(run("size", "-A", "-d", elf).strip())
    instructions = text_instructions(elf)
    chains = inline_chains(elf, [a for a, _ in instructions])

    owners = collections.Counter()
    core_files = collections.Counter()
    for address, size in instructions:
        owner = "std and crates"
        for _, path in chains.get(address, []):
            path = os.path.abspath(path) if path.startswith("/") else path
            if path.startswith(core_src):
                owner = "nodeipam-core"
                core_files[os.path.relpath(path, os.path.dirname(core_src.rstrip(os.sep)))] += size
                break
            if path.startswith(example_src):
                owner = "edge agent (examples/edge-agent/src)"
                break
        owners[owner] += size

    total = sum(size for _, size in instructions)
    print(f"\n.text by source (nearest project frame of each instruction), {total} bytes:")
    for owner, size in owners.most_common():
        print(f"  {size:7d}  {100 * size / total:5.1f} %  {owner}")
    print("\nnodeipam-core bytes per source file:")
    for path, size in core_files.most_common():
        print(f"  {size:7d}  {path}")

    # `nm --size-sort` prints "size type name".
    symbols = [line.split(None, 2) for line in
               run("nm", "--size-sort", "--radix=d", "-C", elf).splitlines()]
    core_symbols = [(int(s[0]), s[2]) for s in symbols
                    if len(s) == 3 and s[1] in "tT" and "nodeipam_core::" in s[2]]
    print(f"\nnon-inlined nodeipam_core symbols (nm): {sum(s for s, _ in core_symbols)} bytes")
    for size, name in sorted(core_symbols, reverse=True):
        print(f"  {size:7d}  {name}")


if __name__ == "__main__":
    main()
