"""`cutbench doctor`: what this machine has for cutbench, and how to fix what is missing.

``run_checks()`` returns a list of :class:`Check`; ``format_checks()`` renders
them as plain text (the CLI prints it). A check never raises: a failure to
look something up is itself reported.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import cutbench
from cutbench.harness.provision.criu import locate, plugin
from cutbench.harness.environment import gpu_probe
from cutbench.harness.model import schema

OK, MISSING, WARN, FAIL = "ok", "missing", "warn", "fail"

# Capability bit numbers (linux/capability.h).
CAP_SYS_ADMIN = 21
CAP_CHECKPOINT_RESTORE = 40

# Python packages reported, with the distribution names that provide them.
PACKAGES = {
    "numpy": ("numpy",),
    "pandas": ("pandas",),
    "pyarrow": ("pyarrow",),
    "hypothesis": ("hypothesis",),
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
    "cuda-bindings": ("cuda-bindings", "cuda-python"),
    "nvidia-ml-py": ("nvidia-ml-py",),
    "psycopg": ("psycopg",),
}
REQUIRED_PACKAGES = ("numpy", "pandas", "pyarrow", "hypothesis")

# Checks whose "missing" is a problem (nothing runs without them); other
# missing things (GPU, optional packages) only narrow what can run.
ESSENTIAL = {"criu"}


@dataclass
class Check:
    """One line of the doctor's report."""

    name: str
    status: str  # "ok" | "missing" | "warn" | "fail"
    detail: str
    fix: str = ""


def _capabilities(status_text: str | None = None) -> int:
    """The effective capability mask of this process (CapEff in /proc/self/status)."""
    if status_text is None:
        status_text = Path("/proc/self/status").read_text()
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status_text, re.M)
    return int(m.group(1), 16) if m else 0


def check_privileges(status_text: str | None = None, euid: int | None = None) -> Check:
    """Root, or CAP_SYS_ADMIN + CAP_CHECKPOINT_RESTORE, which CRIU dump/restore need."""
    euid = os.geteuid() if euid is None else euid
    try:
        caps = _capabilities(status_text)
    except OSError as e:
        return Check("privileges", WARN, f"cannot read capabilities: {e}")
    have = {n: bool(caps >> b & 1) for n, b in
            (("CAP_SYS_ADMIN", CAP_SYS_ADMIN), ("CAP_CHECKPOINT_RESTORE", CAP_CHECKPOINT_RESTORE))}
    detail = f"euid {euid}; " + ", ".join(f"{n} {'yes' if v else 'no'}" for n, v in have.items())
    if all(have.values()):
        return Check("privileges", OK, detail)
    fix = "run cutbench as root (sudo), or grant CAP_SYS_ADMIN and CAP_CHECKPOINT_RESTORE"
    return Check("privileges", FAIL, detail, fix)


def check_kernel() -> Check:
    """Kernel release; CRIU < 4.2 is known broken on >= 6.16, which is why cutbench needs 4.2."""
    rel = platform.release()
    m = re.match(r"(\d+)\.(\d+)", rel)
    detail = f"Linux {rel}"
    if m and (int(m.group(1)), int(m.group(2))) >= (6, 16):
        detail += " (>= 6.16: needs CRIU >= 4.2 for TCP sockets)"
    return Check("kernel", OK, detail)


def check_criu(prefix: Path | None = None) -> tuple[Check, locate.CriuInstall | None]:
    """CRIU path, version, source and `criu check` verdict; also returns the install found."""
    cand = locate.find_criu(prefix)
    if cand is None:
        return Check("criu", MISSING, locate.diagnose(prefix).split("\nFix:")[0], locate.FIX), None
    # find_criu only returns an install that passed `criu check`.
    return Check("criu", OK, f"{cand.version} ({cand.source}) {cand.argv[-1]}; criu check: Looks good."), cand


def check_network_lock(install: locate.CriuInstall | None) -> Check:
    """Whether CRIU can lock the network around a TCP dump: nftables (built in) or iptables."""
    if install is None:
        return Check("network lock", MISSING, "no CRIU to ask", "install CRIU first (see criu)")
    nft = locate.check_feature(install, "network_lock_nftables")
    ipt = shutil.which("iptables-restore") is not None
    if nft:
        return Check("network lock", OK, "nftables (use --network-lock nftables)"
                     + ("; iptables-restore also on PATH" if ipt else "; no iptables-restore on PATH"))
    if ipt:
        return Check("network lock", WARN, "nftables unsupported; iptables (CRIU's default) available")
    return Check("network lock", FAIL, "neither nftables via CRIU nor iptables-restore works",
                 "enable nf_tables in the kernel or install iptables; TCP connections cannot be dumped without it")


def check_gpu(facts: dict | None = None) -> list[Check]:
    """GPU, driver, CUDA, cuda-bindings, CuPy, cuda-checkpoint: missing is fine (CPU backends still work)."""
    facts = gpu_probe.probe() if facts is None else facts
    out = []
    gpus = facts.get("gpus") or []
    if gpus:
        names = "; ".join(f"{g['index']}: {g['name']} {g['uuid']}" for g in gpus)
        out.append(Check("gpu", OK, f"{len(gpus)} GPU(s): {names}; driver {facts.get('driver_version')}, "
                                    f"CUDA {facts.get('cuda_driver_version')}"))
    elif facts.get("nvidia_smi"):
        out.append(Check("gpu", FAIL, f"nvidia-smi present but lists no GPU: {facts.get('nvidia_smi_error')}",
                         "check the NVIDIA driver (nvidia-smi must list the GPU)"))
    else:
        out.append(Check("gpu", MISSING, "no nvidia-smi: no NVIDIA GPU/driver; GPU backends unavailable",
                         "only needed for GPU scenarios: use a host with an NVIDIA GPU and driver >= 570"))
    cb = facts.get("cuda_bindings") or {}
    out.append(_gpu_package("cuda checkpoint API", "cuda-bindings", cb.get("version"), bool(gpus),
                            "cuCheckpointProcess* present" if cb.get("checkpoint_api") else None,
                            cb.get("error") or "missing " + ", ".join(cb.get("missing_calls") or []),
                            "needs cuda-bindings >= 12.8 and an NVIDIA driver >= 570"))
    cp = facts.get("cupy") or {}
    out.append(_gpu_package("cupy device", "CuPy", cp.get("version"), bool(gpus),
                            f"sees {cp['device_count']} device(s)" if cp.get("device_count") else None,
                            f"sees no device: {cp.get('error')}",
                            "install the CuPy wheel matching the driver's CUDA (cupy-cuda13x or cupy-cuda12x)"))
    tool = facts.get("cuda_checkpoint")
    out.append(Check("cuda-checkpoint", OK if tool else MISSING, tool or "utility not on PATH",
                     "" if tool else
                     "only for the `cuda-checkpoint` backend: put NVIDIA's cuda-checkpoint binary on PATH"))
    return out


def _gpu_package(name: str, package: str, version: str | None, gpus: bool, works: str | None, problem: str, fix: str) -> Check:
    """The check of an optional GPU package: OK when it ``works``, else why not (a failure only where GPUs exist)."""
    if version and works:
        return Check(name, OK, f"{package} {version}: {works}")
    if version:
        return Check(name, FAIL if gpus else WARN, f"{package} {version}: {problem}", fix)
    return Check(name, MISSING, f"{package} not installed", f"{install_hint('gpu')} (only for GPU scenarios)")


def install_hint(extra: str = "") -> str:
    """How to install cutbench (with ``extra``) here: from the checkout when running from one, else from the package index."""
    spec = f"[{extra}]" if extra else ""
    return f"pip install -e '.{spec}'" if cutbench.source_checkout() else f"pip install 'cutbench{spec}'"


def check_criu_cuda_plugin(prefix: Path | None = None, install: locate.CriuInstall | None = None) -> Check:
    """CRIU's CUDA plugin for the ``criu-cuda-plugin`` backend: found at PATH or not built; missing is fine.

    With the CRIU ``install`` found, a plugin built for another CRIU version is a warning.
    """
    name = "criu cuda plugin"
    missing = plugin.plugin_missing(prefix)
    if missing:
        problem, fix = missing
        return Check(name, MISSING, problem, f"{fix} (only for the `criu-cuda-plugin` backend; needs gcc, make, libc6-dev)")
    env = os.environ.get(plugin.PLUGIN_ENV)
    found = plugin.plugin_dir(prefix)
    assert found is not None  # plugin_missing found it
    record = plugin.plugin_record(found)
    detail = f"found at {found / plugin.PLUGIN}" + (f" (from ${plugin.PLUGIN_ENV})" if env else "")
    if record:
        detail += f"; built for CRIU {record.get('criu_version')} from {record.get('source')}"
    if install is not None and record and record.get("criu_version") != install.version:
        return Check(name, WARN, f"{detail}, but the CRIU found is {install.version}",
                     "`cutbench criu install --with-cuda-plugin --force` rebuilds it for this CRIU")
    if shutil.which("cuda-checkpoint") is None:
        detail += "; it also needs cuda-checkpoint on PATH, missing (see cuda-checkpoint)"
    return Check(name, OK, detail)


def check_postgres() -> Check:
    """PostgreSQL server binaries for the pg store (initdb on PATH or under /usr/lib/postgresql)."""
    found = shutil.which("initdb") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                                                      reverse=True)), None)
    if found:
        return Check("postgresql", OK, f"initdb at {found}")
    return Check("postgresql", MISSING, "no initdb: the PostgreSQL store and its tests cannot run",
                 "apt-get install postgresql (or `make postgres`); SQLite is the default store")


def check_slurm() -> Check:
    """Which Slurm cluster the slurm backend reaches (SLURM_CONF, the project's local one, the client's default)."""
    from cutbench.harness.provision import slurm

    why = slurm.unavailable_reason()
    if why is None:
        return Check("slurm", OK, slurm.status().removeprefix("slurm: "))
    return Check("slurm", MISSING, f"{why.split('; fix:')[0]}: the slurm backend cannot run",
                 why.split("; fix: ", 1)[1] if "; fix: " in why else "")


def check_packages() -> list[Check]:
    """Installed versions of the Python packages cutbench uses."""
    out = []
    for name, dists in PACKAGES.items():
        version = gpu_probe._dist_version(*dists)
        if version:
            out.append(Check(f"python: {name}", OK, version))
        elif name in REQUIRED_PACKAGES:
            out.append(Check(f"python: {name}", FAIL, "not installed", install_hint()))
        else:
            extra = "pg" if name == "psycopg" else "gpu"
            out.append(Check(f"python: {name}", MISSING, "not installed (optional)", install_hint(extra)))
    return out


def mount_of(path: str | Path, mounts_text: str | None = None) -> tuple[str, str, tuple[str, ...]]:
    """The mount that holds ``path``: its mount point, file system type and options, from ``/proc/self/mounts``
    (or ``mounts_text``, its contents); ``("", "", ())`` when nothing is known of it."""
    target = os.path.realpath(path)
    best: tuple[str, str, tuple[str, ...]] = ("", "", ())
    try:
        text = Path("/proc/self/mounts").read_text() if mounts_text is None else mounts_text
    except OSError:
        return best
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):  # the innermost mount, the last one mounted there
            best = (point, parts[2], tuple(parts[3].split(",")))
    return best


IMAGES_MOUNT_FIX = ("mount -t tmpfs -o size=96g,huge=always cutbench-images /mnt/cutbench-images and set "
                    "pipeline.images_dir = \"/mnt/cutbench-images\" (results/reference/cpu-per-cut: 17% more cuts/hour "
                    "at 1 GiB on the H200)")


def check_images_dir(path: str | Path | None = None, mounts_text: str | None = None) -> Check:
    """Where CRIU writes each cut's image (``path``, default the scenario default ``pipeline.images_dir``): ok on a
    tmpfs with huge pages, warn on one without (every image page is then a 4 KiB page written and faulted back
    in, which at GiB-sized GPU images is a large share of a cut's CPU) or on a disk."""
    if path is None:
        path = schema.default("pipeline.images_dir")
    point, kind, options = mount_of(path, mounts_text)
    name = "images dir"
    if kind != "tmpfs":
        return Check(name, WARN, f"{path} is on {kind or 'an unknown file system'}, not tmpfs: every cut's image "
                                 "goes to that storage and back", IMAGES_MOUNT_FIX)
    huge = next((o.split("=", 1)[1] for o in options if o.startswith("huge=")), "never")
    if huge in ("always", "within_size"):
        return Check(name, OK, f"{path}: tmpfs at {point} with huge={huge}")
    return Check(name, WARN, f"{path}: tmpfs at {point} without huge pages (huge={huge}): fine for small images; "
                             "GiB-sized GPU images cost more CPU per cut", IMAGES_MOUNT_FIX)


def run_checks(prefix: Path | None = None) -> list[Check]:
    """Every doctor check, in report order."""
    checks = []
    criu, install = check_criu(prefix)
    checks.append(criu)
    checks.append(check_privileges())
    checks.append(check_kernel())
    checks.append(check_network_lock(install))
    checks += check_gpu()
    checks.append(check_criu_cuda_plugin(prefix, install))
    checks.append(check_postgres())
    checks.append(check_slurm())
    checks.append(check_images_dir())
    checks += check_packages()
    return checks


def format_checks(checks: list[Check]) -> str:
    """Plain text, one check per line, each fix indented below it."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        pad = " " * (width + 12)
        first, *rest = (c.detail or "").splitlines() or [""]
        lines.append(f"[{c.status:^7}] {c.name:<{width}}  {first}")
        lines += [pad + r for r in rest]
        if c.fix and c.status != OK:
            lines.append(f"{pad}fix: {c.fix}")
    bad = [c.name for c in problems(checks)]
    lines.append("")
    lines.append(f"{len(bad)} problem(s): {', '.join(bad)}" if bad else "no problems")
    return "\n".join(lines)


def problems(checks: list[Check]) -> list[Check]:
    """The checks that stop cutbench from running: failures and missing essentials."""
    return [c for c in checks if c.status == FAIL or (c.status == MISSING and c.name in ESSENTIAL)]
