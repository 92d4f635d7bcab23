"""An effects parser for GROMACS's md.log: one effect per energy record, ``(step, energies)``.

GROMACS writes, every ``nstlog`` steps::

               Step           Time
                100        0.20000

       Energies (kJ/mol)
            LJ (SR)   Coulomb (SR)      Potential    Kinetic En.   Total Energy
        9.06618e+02   -4.63865e+03   -3.73203e+03    2.39214e+03   -1.33989e+03
      Conserved En.    Temperature Pressure (bar)
        5.34556e+03    7.18372e+02    1.01831e+04

The effect's index is the step and its payload the values as printed. Lines
between records (checkpoint notes, the closing averages) are no effect. This
module is the scenario's, not GROMACS's and not cutbench's: it imports
neither. cutbench makes one ``Energies()`` per start of the program and calls
it with each line.
"""

from __future__ import annotations


def _numbers(text: str) -> bool:
    try:
        [float(word) for word in text.split()]
    except ValueError:
        return False
    return bool(text.split())


class Energies:
    """Called with each line of md.log; returns the ``(step, values)`` record a line completes (or nothing)."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.header = False  # the line after "Step Time" holds the step
        self.block = False  # inside "Energies (kJ/mol)"
        self.values: list[str] = []

    def __call__(self, line: str) -> list[tuple[int, str]]:
        text = line.strip()
        if text.split() == ["Step", "Time"]:
            self.header, self.step, self.block, self.values = True, None, False, []
            return []
        if self.header:
            self.header = False
            words = text.split()
            self.step = int(words[0]) if words and words[0].isdigit() else None
            return []
        if self.step is None:
            return []
        if text.startswith("Energies"):
            self.block = True
            return []
        if not self.block:
            return []
        if not text:  # the blank line that closes the record
            out = [(self.step, " ".join(self.values))] if self.values else []
            self.step, self.block, self.values = None, False, []
            return out
        if _numbers(text):
            self.values.extend(text.split())
        return []
