"""The measuring core, free of pytest and of any toolchain: paired timing rounds on rotated fresh
inputs, the statistics that decide "faster", the physics ceilings no honest kernel beats, memory
passes in C, and the contention probe that tells a busy machine from a slow kernel."""
