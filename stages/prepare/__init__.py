"""The prepare stage's own code: `stage.py` runs it (`run`, `VERSION`), `report.py` is what it writes. Importing the package imports nothing else."""
