"""The optimize session: pytest hooks (session.py), the loop per operator (loop.py), the decision and
its verification (decide.py), the commit (commit.py), and the one border where a KopeError becomes a
pytest error (border.py). Imported only under `--kope-optimize` or `--kope-check`, or on an error path.
"""
