"""The optimize session: pytest hooks (session.py), the loop per operator (loop.py, which reads in
order: baseline, search, verification, commit), the search's decisions (decide.py), the winner's
verification (verify.py), the commit and the operator's summary (commit.py), and the one border where a
KopeError becomes a pytest error (border.py). Imported only under `--kope-optimize` or `--kope-check`,
or on an error path.
"""
