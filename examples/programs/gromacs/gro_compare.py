"""An artefact comparison for GROMACS's final structure: how far apart two ``.gro`` files are.

A ``.gro`` file holds a title, the atom count, one line per atom (residue,
atom name, number, then x, y, z in nm, and velocities when written) and the
box. ``largest_shift`` returns the largest difference of any coordinate, in
nm, between the reference run's structure and another's (infinity when the
atoms differ or the other cannot be read), and the scenario states the tolerance it allows. It imports
neither GROMACS nor cutbench.
"""

from __future__ import annotations

import math
from pathlib import Path


def _coordinates(path: Path) -> list[tuple[str, tuple[float, float, float]]]:
    lines = path.read_text().splitlines()
    count = int(lines[1])
    atoms = []
    for line in lines[2:2 + count]:
        # Fixed columns: 5+5 residue, 5 atom name, 5 number, then 8.3 each for x, y, z.
        atoms.append((line[:20], (float(line[20:28]), float(line[28:36]), float(line[36:44]))))
    return atoms


def largest_shift(reference: Path, candidate: Path) -> float:
    """The largest coordinate difference (nm) between the two structures; infinity if their atoms differ."""
    ref = _coordinates(reference)
    try:
        got = _coordinates(candidate)
    except (IndexError, ValueError):  # truncated or damaged: as far from the reference as can be
        return math.inf
    if [name for name, _ in ref] != [name for name, _ in got]:
        return math.inf
    return max((abs(a - b) for (_, xs), (_, ys) in zip(ref, got) for a, b in zip(xs, ys)), default=0.0)
