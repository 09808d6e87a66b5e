"""Every trtflow error reaches the parent from a stage's process as it was raised: its type, message, hint, exit
code and attributes (issue #49: a release-ledger refusal, `LedgerError(where, why)`, came back as `TypeError:
LedgerError.__init__() missing 1 required positional argument: 'why'`, an unexpected error `retries:` ran again)."""
from __future__ import annotations

import errno
import importlib
import inspect
import multiprocessing
import threading
from pathlib import Path

import pytest

from tests.test_layout import _sources
from trtflow.artifact import StageResult
from trtflow.errors import StageError, TransientStageError, TrtflowError
from trtflow.flows import isolate


def _every_error_class() -> list[type[TrtflowError]]:
    """The error root and every subclass trtflow defines, every module of it imported (stages/, flows/, pipelines/
    included)."""
    for name in sorted(_sources()):
        module = name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        if not module.endswith(".__main__"):  # the CLI's entry point: runs it
            importlib.import_module(module)
    found, todo = [], [TrtflowError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return sorted({c for c in found if c.__module__.startswith("trtflow.")}, key=lambda c: c.__qualname__)


class Refusal(StageError):
    """A constructor of its own: required positional and keyword-only arguments, none of them the message, attributes
    it sets, and an exit code of its instance."""

    def __init__(self, where: Path, count: int, /, why: str, *, items: list[str], hint: str | None = None):
        super().__init__(f"{where}: {count} records unreadable ({why})", hint=hint or "restore them")
        self.where, self.count, self.why, self.items = where, count, why, items
        self.exit_code = 4


# a value for a constructor's parameter, by the first word of its annotation found here (else a string)
VALUES = {"OSError": OSError(errno.ENOSPC, "No space left on device"), "StageResult":
          StageResult(outputs={"report": Path("/out/report.json")}, summary="out of tolerance", metrics={"x": 1.5}),
          "Path": Path("/store/shared/releases/cls/native/2.json"), "int": 7, "tuple": ("stages", "build", 0)}


def _value(param: inspect.Parameter):
    annotation = str(param.annotation)
    return next((v for word, v in VALUES.items() if word in annotation), f"<{param.name}>")


def _instance(cls: type[TrtflowError]) -> TrtflowError:
    """An instance of `cls` made through its own constructor, every parameter given (the optional ones too)."""
    positional, keywords = [], {}
    for param in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.kind == param.KEYWORD_ONLY:
            keywords[param.name] = _value(param)
        else:
            positional.append(_value(param))
    error = cls(*positional, **keywords)
    error.tell(traceback="Traceback ...", log="the stage's output")
    return error


def _across(error: BaseException) -> BaseException:
    """`error` as the parent receives it: sent by the stage's process as `_child` sends it, over a real pipe."""
    receiver, sender = multiprocessing.Pipe(duplex=False)
    sender.send_bytes(isolate.raised(error, "its traceback"))
    message = receiver.recv()
    assert message.traceback == "its traceback"
    return message.error


def _attributes(error: BaseException) -> dict[str, str]:
    return {k: repr(v) for k, v in vars(error).items()}


@pytest.mark.parametrize("cls", [*_every_error_class(), Refusal], ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_error_crosses_from_a_stage_process_whole(cls):
    error = _instance(cls)
    back = _across(error)
    assert type(back) is cls
    assert str(back) == str(error) and back.args == error.args
    assert back.hint == error.hint and back.exit_code == error.exit_code
    assert _attributes(back) == _attributes(error), "every attribute its constructor set, and its failure's traceback and log"


def test_the_walk_finds_the_errors_defined_outside_the_floor():
    names = {f"{c.__module__}.{c.__qualname__}" for c in _every_error_class()}
    assert {"trtflow.stages.release.triton.versions.LedgerError", "trtflow.stages.ort.qdq.QuantizerCrash",
            "trtflow.flows.machine.EventNotSent", "trtflow.disk.DiskError", "trtflow.errors.SpecError"} <= names


def test_an_error_with_an_attribute_that_does_not_pickle_keeps_its_type_message_and_hint():
    error = Refusal(Path("/x"), 2, "truncated", items=["a"])
    error.lock = threading.Lock()
    back = _across(error)
    assert type(back) is Refusal and str(back) == str(error) and back.hint == "restore them"
    assert back.exit_code == 4 and back.items == ["a"] and not hasattr(back, "lock")


def test_an_error_whose_class_does_not_pickle_arrives_as_its_nearest_class_that_does():
    class Local(TransientStageError):  # defined in a function: pickle cannot name it
        exit_code = 5

    back = _across(Local("the GPU went away", hint="run again"))
    assert type(back) is TransientStageError, "still transient: retried, as the stage meant"
    assert str(back) == "the GPU went away (run again)" and back.hint == "run again" and back.exit_code == 5


def test_an_exception_the_parent_cannot_rebuild_is_unexpected_not_a_type_error():
    from trtflow.stages.ort.runner import ReferenceFailed  # not a trtflow error; a constructor of its own

    back = _across(ReferenceFailed(ValueError("bad input"), {}))
    assert type(back) is RuntimeError and str(back) == "ReferenceFailed: bad input"


def test_a_ledger_refusal_in_a_stage_process_reaches_the_parent_as_itself(tmp_path, monkeypatch):
    """The real refusal (a truncated record of the release ledger), raised in a stage's process that `call_stage`
    started from the fork server: the parent gets the LedgerError, its line and hint, never retried."""
    from trtflow.stages.release.triton import versions

    monkeypatch.delenv(isolate.IN_PROCESS, raising=False)
    shared = tmp_path / "shared"
    record = shared / "releases" / "cls" / "native" / "2.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"version": 2, "owner": "')
    with pytest.raises(versions.LedgerError) as here:
        versions.read(shared, "cls", "native")
    with pytest.raises(versions.LedgerError) as there:
        isolate.call_stage(versions.read, (shared, "cls", "native"), 60, "release")
    error = there.value
    assert str(error) == str(here.value)
    assert str(error).startswith(f"release: {record}: unreadable release ledger (")
    assert error.hint == here.value.hint and error.hint and str(error).endswith(f"({error.hint})")
    assert not isinstance(error, TransientStageError) and error.exit_code == 1
    assert "LedgerError" in error.failure.traceback
