"""`trtflow init`: a first pipeline file proposed from what a model and its sample data say.

`model.py` reads the model's inputs and outputs, `data.py` the sample files, `task.py` guesses how the outputs'
users judge them (the task metrics), `profile.py` proposes the optimization profile, `propose.py` puts them
together and `write.py` writes the commented YAML. What cannot be inferred is refused with one line naming the flag
that says it (a SpecError: exit 2)."""
from __future__ import annotations

# the values of --task and --layout (the CLI lists them without importing the rest)
TASKS = ("classify", "detect", "segment", "ocr-det", "ocr-rec", "embed", "image", "regress", "other")
LAYOUTS = ("yolov5", "yolov8", "end2end")
