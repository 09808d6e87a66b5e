"""Issue #67, found on the way (secrets in arguments): an artifact store's URL is printed, recorded with every result
and posted to Prefect, so one holding a secret (a userinfo password, a query key naming one) is refused where it is
given, `artifacts:` or `--store`, in one line that does not repeat it."""
from __future__ import annotations

import pytest

from trtflow.errors import SpecError
from trtflow.pipelines.loader import load_text
from trtflow.secrets import holds_secret

PIPE = 'version: 1\nname: s\nmodel: m.onnx\nartifacts: "{url}"\nstages:\n  p: {{kind: prepare}}\n'
SECRET_URLS = ["ftp://fleet:hunter2@10.0.0.5/trtflow", "s3://AKIAEXAMPLE:hunter2@models/trtflow",
               "gcs://models/trtflow?token=hunter2", "s3://models/x?aws_secret_access_key=hunter2"]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_a_store_url_holding_a_secret_is_refused_without_repeating_it(tmp_path, url):
    with pytest.raises(SpecError) as exc:
        load_text(PIPE.format(url=url), tmp_path / "pipeline.yaml", check_files=False)
    said = str(exc.value)
    assert "hunter2" not in said and "artifacts: the store's URL holds a secret" in said and exc.value.line == 4


def test_a_store_url_without_one_is_taken(tmp_path):
    loaded = load_text(PIPE.format(url="s3://models/trtflow"), tmp_path / "pipeline.yaml", check_files=False)
    assert loaded.store_location == "s3://models/trtflow" and not holds_secret("s3://models/trtflow?region=eu")


def test_store_option_holding_a_secret_is_exit_2_in_one_line(tmp_path, capsys):
    import shutil

    from tests.assets import PPOCR
    from trtflow.flows.cli import main

    shutil.copy(PPOCR, tmp_path / "m.onnx")
    (tmp_path / "pipeline.yaml").write_text(PIPE.format(url="s3://models/trtflow"))
    code = main(["plan", str(tmp_path / "pipeline.yaml"), "--store", SECRET_URLS[0]])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "hunter2" not in err[0] and "--store" in err[0], err
