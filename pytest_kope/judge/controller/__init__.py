"""The judge's controller side, in the optimize run's own process: plan a judgement, start jailed
children from warm fork servers, and decide each child's verdict from its signed events alone.
Nothing here imports a candidate's code; what a child says is data, never trusted text."""
