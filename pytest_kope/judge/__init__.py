"""The judge: a candidate wins only on the repo's own tests and a paired timing, in three sides.

`controller/` runs in the optimize run's process: it plans a judgement (`runner`), starts jailed
children from warm fork servers (`launch`, `servers`, `sandbox`, `executors`, `ray_executor`), and
decides each child's verdict from its signed events alone (`verdict`). `child/` runs inside the jail:
the pytest plugin a judging child loads (`plugin`), the fork server it is forked from, the guards
around every kernel call, the differential replay and drawn calls. `measure/` is the timing core both
sides share, with no pytest in it: paired rounds, rotated inputs, statistics, physics ceilings and
memory passes. `outcome`, `protocol` and `arrays` are what the sides exchange.
"""
