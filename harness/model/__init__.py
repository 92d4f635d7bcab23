"""The model: the data every role of the harness exchanges, and nothing that acts.

Owns cut plans (``plan``), every field of a scenario file declared once
(``schema``), the validated scenario and its arms (``scenario``), the
recovery-cut certificates (``certificate``: which logical cut a
checkpoint's bytes belong to), the trial's spec, result and verdict types (``trial``) and
the timed stage log (``timeline``), and a program's system-call boundaries
(``boundaries``: which calls count, a boundary's name, two recordings compared). It imports only the ground floor and the
workloads' declared contracts; it runs no process and writes no file.
"""
