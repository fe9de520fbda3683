"""What a reviewer sees of a run: the verified winner committed to its branch without touching the
user's checkout (`vcs`), pushed and proposed as a pull request (`publish`, `forge`, `prbase`,
`prbody`), and the run's report and plots (`report`, `summary`: an operator's entry typed,
`report_formats`, `report_md`, `plot`)."""
