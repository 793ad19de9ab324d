"""dsrope_dev: the project's own development tooling, kept out of the installed gate (dsrope_gate).

It lives in the repository only (dev/, on the path of the suite, the nox sessions and tools/) and is never
packaged: a user who installs dsrope[gate] to judge an implementation gets none of it.
"""
