"""The history of runs across commits: a store of runs keyed by their stack, each case's
series over them, and where it changed."""
