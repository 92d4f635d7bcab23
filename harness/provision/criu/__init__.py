"""CRIU: finding the one to run (invocation), and provisioning one where there is none.

cutbench needs CRIU >= 4.2: older releases fail ``criu check`` on recent
kernels (vDSO bounds on 6.18) and cannot dump TCP sockets on Linux >= 6.16.
When no such CRIU is on PATH, ``cutbench criu install`` fetches Debian's
``criu`` package and every library it depends on with ``apt-get download``
(mirror and keyring taken from the machine's own apt configuration), unpacks
them into a project-local prefix, and runs CRIU through the *bundled* dynamic
loader::

    PREFIX/root/usr/lib/<triple>/ld-linux-*.so.* --library-path PREFIX/root/usr/lib/<triple> PREFIX/root/usr/sbin/criu

so nothing is taken from the host's libc. ``--library-path`` (unlike
``LD_LIBRARY_PATH``) does not leak into programs CRIU executes.

Prefix layout::

    PREFIX/root/        the unpacked .debs
    PREFIX/bin/criu     a relocatable shell wrapper (for tools that want `criu` on PATH)
    PREFIX/install.json what was installed, from where
    PREFIX/lib/criu/    CRIU's CUDA plugin, ``cuda_plugin.so`` (``--with-cuda-plugin``), and its record
    PREFIX/build/       the unpacked CRIU source it was built in, kept so a rebuild is quick

One concern per module. Invocation, what a run, a backend or the doctor uses:

- ``locate``: the CRIU to run (bundled under the prefix, or on PATH), its
  version, ``criu check``, and why none was found; where the prefix is.
- ``plugin``: where CRIU's CUDA plugin is (for ``--libdir``), and why it is not.

Provisioning, what ``cutbench criu install`` does:

- ``install``: the command itself (``install``): download or ``--from DIR``,
  unpack, check, swap in; then the plugin when asked.
- ``apt``: reading the machine's apt configuration and apt's output (runs nothing).
- ``fetch``: downloading with apt from a private, throw-away apt state.
- ``unpack``: .deb and tar extraction.
- ``plugin_build``: the CUDA plugin built from the same CRIU release's source.
- ``prefix``: the one way a prefix changes (lock, check again, stage, swap in).

Shared by both: ``tools`` (running an outside program; the tail of its output
for error messages).

The direction of imports: invocation (``locate``, ``plugin``) imports only
itself and ``tools``, never provisioning, so a trial loads no apt or build
code (``tests/unit/test_criu_tool.py`` checks it); ``install`` sits on top. This ``__init__`` imports nothing: name the module
you need (``from cutbench.harness.provision.criu import locate``).
"""
