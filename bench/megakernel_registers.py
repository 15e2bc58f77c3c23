"""Where the megakernel's registers go: live registers per function of each kernel, at its peak and at its block
barriers, from the compiled code. No GPU needed.

ptxas reports one register count a kernel (the most it allocates) and its spills; that says nothing of what is
live where. This compiles csrc/megakernel for sm_90a to a cubin, runs `nvdisasm --print-life-ranges` on it and
reads the live-register count it prints for every instruction. Live registers at a `__syncthreads` (BAR.SYNC)
between stages are what a stage's code keeps held for later ones, a floor for every stage in between:
what stays live there is not free for a stage's weights in flight (docs/lab/BENCHMARKS-LOG.md, megakernel
step 8).

nvdisasm comes from the CUDA toolkit; where the toolkit lacks it (this project's CI machines have nvcc and
ptxas only), NVIDIA's `nvidia-cuda-nvdisasm` wheel is fetched from the package index into the user's cache.

    python bench/megakernel_registers.py
    python bench/megakernel_registers.py --source .dev/variant/csrc/megakernel   # another copy of the kernel
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NVDISASM_WHEEL = "nvidia-cuda-nvdisasm==13.5.37"  # any 12.8+ disassembles sm_90a

_KERNEL = re.compile(r"^\.text\.(\S+):")
_FUNCTION = re.compile(r"^\$(\S+?)\$(\S+):")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*//\s*\|\s*(\d+)")


def nvdisasm() -> Path:
    """An nvdisasm executable: on PATH, beside nvcc, or from NVIDIA's wheel (fetched once into the cache)."""
    found = shutil.which("nvdisasm")
    if found:
        return Path(found)
    nvcc = shutil.which("nvcc")
    if nvcc and (Path(nvcc).resolve().parent / "nvdisasm").is_file():
        return Path(nvcc).resolve().parent / "nvdisasm"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "parley" / "nvdisasm"
    binary = cache / "nvdisasm"
    if not binary.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", folder, NVDISASM_WHEEL],
                           check=True)
            wheel = next(Path(folder).glob("*.whl"))
            with zipfile.ZipFile(wheel) as archive:
                member = next(n for n in archive.namelist() if n.endswith("/bin/nvdisasm"))
                binary.write_bytes(archive.read(member))
        binary.chmod(0o755)
    return binary


def disassemble(source: Path) -> str:
    """nvdisasm's listing, with life ranges, of megakernel.cu in `source` built for sm_90a."""
    if shutil.which("nvcc") is None:
        raise SystemExit("bench/megakernel_registers.py: nvcc not found (CUDA 12+ needed)")
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "megakernel.cubin"
        subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90a", "-cubin", str(source / "megakernel.cu"),
                        "-o", str(cubin)], check=True)
        return subprocess.run([str(nvdisasm()), "--print-life-ranges", str(cubin)], check=True,
                              capture_output=True, text=True).stdout


@dataclass
class Region:
    """A kernel's own code, or one of the functions compiled into it (noinline or runtime helpers)."""

    kernel: str
    function: str
    instructions: int = 0
    peak: int = -1  # the most registers live at one instruction ...
    peak_at: str = ""  # ... and that instruction
    at_barriers: list[int] = field(default_factory=list)  # live registers at each BAR.SYNC


def regions(listing: str) -> list[Region]:
    """The listing's instructions grouped by kernel and function, in order."""
    found: list[Region] = []
    for line in listing.splitlines():
        if match := _KERNEL.match(line):
            found.append(Region(match.group(1), "(kernel)"))
        elif (match := _FUNCTION.match(line)) and found:
            found.append(Region(found[-1].kernel, match.group(2)))
        elif (match := _INSTRUCTION.match(line)) and found:
            region, count, text = found[-1], int(match.group(3)), match.group(2)
            region.instructions += 1
            if count > region.peak:
                region.peak, region.peak_at = count, f"{match.group(1)}: {text}"
            if "BAR.SYNC" in text:
                region.at_barriers.append(count)
    return [r for r in found if r.instructions]


def demangled(names: list[str]) -> dict[str, str]:
    """Readable names (c++filt where present, else the mangled ones), shortened to the function's name."""
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return {n: d.split("(")[0] for n, d in zip(names, out.splitlines())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=ROOT / "csrc" / "megakernel",
                        help="folder holding megakernel.cu (default: this tree's csrc/megakernel)")
    parser.add_argument("--all", action="store_true", help="also the runtime's helpers (division slow paths ...)")
    args = parser.parse_args()
    found = regions(disassemble(args.source))
    if not found:
        raise SystemExit("bench/megakernel_registers.py: no instructions with life ranges in nvdisasm's listing")
    names = demangled(sorted({r.kernel for r in found} | {r.function for r in found} - {"(kernel)"}))
    print(f"{args.source}, sm_90a: live registers (GPRs) per instruction, from nvdisasm --print-life-ranges\n")
    print("| kernel | function | instructions | peak | at BAR.SYNC min / median / max | peak at |")
    print("|---|---|---|---|---|---|")
    for r in found:
        if not args.all and r.function.startswith("__cuda_"):
            continue
        bars = (f"{min(r.at_barriers)} / {statistics.median(r.at_barriers):.0f} / {max(r.at_barriers)}"
                if r.at_barriers else "-")
        print(f"| {names[r.kernel]} | {names.get(r.function, r.function)} | {r.instructions} | {r.peak} | {bars} "
              f"| `{r.peak_at[:70]}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
