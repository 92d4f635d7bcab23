#!/bin/sh
# GROMACS as it is: build the system from the package's own data once (gmx solvate, grompp: no download),
# then run mdrun reproducibly on one thread, writing a checkpoint every 0.005 min (0.3 s). Extra arguments
# (the app backend's "-cpi md.cpt") go to mdrun: its own restart from its checkpoint.
set -e
if [ ! -f md.tpr ]; then
    gmx -quiet solvate -cs spc216.gro -box 1.6 1.6 1.6 -o water.gro >/dev/null 2>&1
    n=$(grep -c OW water.gro)
    printf '#include "oplsaa.ff/forcefield.itp"\n#include "oplsaa.ff/spc.itp"\n[ system ]\nwater\n[ molecules ]\nSOL %s\n' "$n" > topol.top
    gmx -quiet grompp -f md.mdp -c water.gro -p topol.top -o md.tpr -maxwarn 1 >/dev/null 2>grompp.err || { cat grompp.err >&2; exit 1; }
fi
exec gmx -quiet mdrun -s md.tpr -deffnm md -reprod -nt 1 -cpt 0.005 "$@"
