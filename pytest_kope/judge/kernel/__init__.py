"""The kernel-only process and the proxy that calls it: candidate code runs here and nowhere else.

A judging process (a test host: the repo's tests, their asserts, the guards, the clock) never loads a
candidate. Each kernel it calls, the candidate's or the incumbent's, is served by a process of its
own (`serve.py`), jailed (`jail.py`), under a seccomp filter (`seccomp.py`), stopped whenever it is
not serving a call or a timed block (`process.py`). Arguments travel in memory the two share
(`arena.py`); messages are JSON on a socket pair (`wire.py`), never pickles. `remote.py` gives the
host a `Kernel` whose functions forward each call, so the guards, the differential check and the
timing core run unchanged around them.
"""
