"""Stage reports as typed models that render their own Markdown summary: `report.json` is the model's JSON, the
Prefect artifact its `summary()`. One module per kind; a report never imports a stage module."""
