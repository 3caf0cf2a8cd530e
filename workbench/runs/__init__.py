"""A run's lifecycle on disk and in the process: its directory (one writer, a record from the first
second), identity, resume, final weights and outcome, what stops it (signals, guard, limits), and
a sweep's folder. Below the recipes and export, which both read runs."""
