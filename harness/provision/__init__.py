"""Provisioning: the tools cutbench drives, found, checked, installed and started.

``criu`` (a package) finds, checks and installs CRIU and builds its CUDA plugin (its ``__init__`` maps the
modules); ``engines`` finds the container engines and starts and stops the project's own ``dockerd``; ``slurm`` finds the
Slurm cluster the ``slurm`` backend submits to and starts and stops a local one of the project's own, from Debian's
packages installed or carried into a prefix by ``slurm_bundle`` (``cutbench slurm install``). Nothing
here judges or runs a trial: the environment's facts (:mod:`cutbench.harness.environment`) and the nemesis's
backends ask it which tool to run and how.
"""
