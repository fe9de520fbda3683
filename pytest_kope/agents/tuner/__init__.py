"""The offline tuner: a search over the tuning space a kernel declares, guided by the experience graph.

- `agent.py`: `Tuner`, the agent (proposals from the graph's prior, a model of each axis, exploration);
- `state.py`: what it knows of one operator between rounds;
- `exploration.py`: which axes were tried around the incumbent (`Exploration`, in the report);
- `search.py`: the same search replayed over measured tables, for the benches and tests.
"""
