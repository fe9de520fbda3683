"""The judge: isolation, phases, paired timing, verification (controller and child sides)."""
