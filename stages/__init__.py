"""The work of each stage: plain Python, no Prefect import, testable with pytest alone."""
