"""Reading apt: the machine's sources (which Debian mirror, which keyring) and what apt's commands print.

Owns the parsers for ``sources.list`` (one-line style) and deb822
``.sources`` files, the choice of the Debian mirror CRIU is fetched from
(:func:`mirror_and_keyring`, the one place it is looked up), and the reading of
``apt-cache`` output and Debian version strings.

Must not run apt or anything else: it reads files under ``/etc/apt`` (or the
directory given) and strings; ``fetch`` runs apt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from cutbench.errors import Unavailable

# Debian code names and suite aliases; a source whose suite is one of these
# (optionally with -updates/-backports) is a Debian archive. Security archives
# carry only security updates, never `criu` from unstable, so they are skipped.
DEBIAN_SUITES = {
    "sid", "unstable", "experimental", "testing", "stable", "oldstable", "oldoldstable",
    "stretch", "buster", "bullseye", "bookworm", "trixie", "forky", "duke",
}


@dataclass
class AptSource:
    """One apt source entry (one URI) from sources.list or a deb822 .sources file."""

    uri: str
    suites: list[str]
    components: list[str] = field(default_factory=list)
    signed_by: str | None = None  # a keyring path, or an embedded ASCII-armoured key
    types: list[str] = field(default_factory=lambda: ["deb"])
    origin: str = ""

    @property
    def is_debian(self) -> bool:
        """Whether this looks like a Debian archive (not security, not Ubuntu or a third party)."""
        if "security" in self.uri or any(s.endswith("-security") or "/updates" in s for s in self.suites):
            return False
        if not self.uri.startswith(("http://", "https://", "mirror+", "file:")):
            return False
        bases = {re.sub(r"-(updates|backports|backports-sloppy|proposed-updates)$", "", s) for s in self.suites}
        return bool(bases & DEBIAN_SUITES) or self.uri.rstrip("/").endswith("/debian")


def parse_deb822(text: str, origin: str = "") -> list[AptSource]:
    """The sources of a deb822 ``.sources`` file, one per URI; stanzas with ``Enabled: no`` are dropped."""
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:  # continuation line ("." is an empty line)
                cont = line.strip()
                fields[key] += "\n" + ("" if cont == "." else cont)
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "uris" not in fields or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields["uris"].split():
            out.append(AptSource(
                uri=uri,
                suites=fields.get("suites", "").split(),
                components=fields.get("components", "").split(),
                signed_by=fields.get("signed-by", "").strip() or None,
                types=fields.get("types", "deb").split(),
                origin=origin,
            ))
    return out


def parse_one_line(text: str, origin: str = "") -> list[AptSource]:
    """The sources of one-line-style ``sources.list`` text (``deb [opts] URI SUITE COMP...``), one per line."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        m = re.match(r"^(deb|deb-src)\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s*(.*)$", line)
        if not m:
            continue
        opts = dict(o.split("=", 1) for o in (m.group(2) or "").split() if "=" in o)
        out.append(AptSource(
            uri=m.group(3),
            suites=[m.group(4)],
            components=m.group(5).split(),
            signed_by=opts.get("signed-by"),
            types=[m.group(1)],
            origin=origin,
        ))
    return out


def read_apt_sources(etc_apt: Path = Path("/etc/apt")) -> list[AptSource]:
    """All apt sources in the order apt reads them: sources.list, then sources.list.d/ by name."""
    files = [etc_apt / "sources.list"]
    parts = etc_apt / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    out: list[AptSource] = []
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        out += parse_deb822(text, str(f)) if f.suffix == ".sources" else parse_one_line(text, str(f))
    return out


def debian_mirror(etc_apt: Path = Path("/etc/apt")) -> AptSource:
    """The first Debian binary mirror in the machine's apt configuration; Unavailable if none."""
    for src in read_apt_sources(etc_apt):
        if "deb" in src.types and src.is_debian:
            return src
    raise Unavailable(
        f"no Debian mirror found in {etc_apt}/sources.list or {etc_apt}/sources.list.d/ "
        "(needed to fetch Debian's criu package). Fix: pass a Debian mirror explicitly "
        "(`cutbench criu install --mirror http://<debian mirror>/debian`), or run "
        "`cutbench criu install --download-only DIR` on a Debian machine and `--from DIR` here"
    )


def mirror_and_keyring(
    mirror: str | None, keyring: str | None, etc_apt: Path = Path("/etc/apt")
) -> tuple[str, str | None]:
    """The ``(mirror, keyring)`` to fetch from: ``mirror`` as given, else :func:`debian_mirror`'s with its keyring.

    A ``keyring`` given wins over the configured one; an explicit ``mirror``
    keeps the ``keyring`` given (None: apt's default keyrings).
    """
    if mirror is not None:
        return mirror, keyring
    src = debian_mirror(etc_apt)
    return src.uri, keyring or src.signed_by


def resolve_packages(apt_cache_output: str) -> list[str]:
    """Package names from ``apt-cache depends --recurse`` output, sorted (virtual ``<pkg>`` entries dropped)."""
    names = {ln.strip() for ln in apt_cache_output.splitlines() if ln and not ln[0].isspace()}
    return sorted(n for n in names if not n.startswith("<"))


def upstream_version(debian_version: str) -> str:
    """The upstream part of a Debian version: ``4.2.1`` from ``4.2.1-1`` or ``1:4.2.1-1+b1``."""
    v = debian_version.split(":", 1)[-1]
    return v.rsplit("-", 1)[0] if "-" in v else v
