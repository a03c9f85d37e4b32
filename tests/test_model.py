"""Pure parts of the job model: options, sizes, durations, the report protocol."""

import pytest

from jupyterlab_mlcluster.jobs.model import (
    JobSpec,
    SpecError,
    format_memory,
    parse_duration,
    parse_memory,
)
from jupyterlab_mlcluster.runtime.protocol import MARKER, OutputParser, encode_record, parse_tqdm


@pytest.mark.parametrize(
    "text,expected",
    [
        ("4Gi", 4 * 1024**3),
        ("512Mi", 512 * 1024**2),
        ("2G", 2 * 10**9),
        ("2GB", 2 * 10**9),
        ("1.5Gi", int(1.5 * 1024**3)),
        ("1000", 1000),
    ],
)
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["lots", "4 gigs", "-1Gi", "0", "Gi", "4Xi"])
def test_parse_memory_rejects(text):
    with pytest.raises(SpecError, match="memory"):
        parse_memory(text)


def test_format_memory_round_trips():
    for text in ("4Gi", "512Mi", "2G", "1500M", "123"):
        assert format_memory(parse_memory(text)) == text


@pytest.mark.parametrize(
    "text,seconds",
    [("90s", 90), ("30m", 1800), ("1h30m", 5400), ("2d", 172800), ("45", 45), ("500ms", 0.5)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["soon", "1x", "-5", "0", "m30", "0s", "30m1h", "10000d", "62617d52.6h40ms3092s"]
)
def test_parse_duration_rejects(text):
    with pytest.raises(SpecError, match="timeout"):
        parse_duration(text)


def test_spec_from_options_converts_and_validates():
    spec = JobSpec.from_options(
        {
            "workers": "4",
            "memory": "1Gi",
            "timeout": "10m",
            "env": ["A=1", "B=x=y"],
            "framework": "JAX",
            "priority": "-3",
        }
    )
    assert (spec.workers, spec.memory, spec.timeout, spec.framework, spec.priority) == (
        4,
        1024**3,
        600.0,
        "jax",
        -3,
    )
    assert spec.env == {"A": "1", "B": "x=y"}


def test_the_tensorboard_directory_is_the_one_engine_variable_a_user_may_set():
    spec = JobSpec.from_options({"env": {"MLCLUSTER_TENSORBOARD_DIR": "/tb"}})
    assert spec.env == {"MLCLUSTER_TENSORBOARD_DIR": "/tb"}


def test_attack_a_plain_job_with_the_session_variable_is_refused():
    """With MLCLUSTER_SESSION set, a plain job's rank became a session rank that waited for
    commands, ran nothing and reported success (a pod on Kubernetes would have listened
    until the job's timeout). Now the job's options are refused, by every front end (they
    all build the spec with from_options) before anything is stored."""
    for name in ("MLCLUSTER_SESSION", "MLCLUSTER_SESSION_ORPHAN_TIMEOUT", "MLCLUSTER_REPORT"):
        with pytest.raises(SpecError, match=f"{name}: MLCLUSTER_"):
            JobSpec.from_options({"workers": 1, "env": {name: "x"}})


@pytest.mark.parametrize(
    "options,message",
    [
        ({"workers": 0}, "workers must be at least 1"),
        ({"workers": "four"}, "workers must be an integer"),
        ({"workers": 2.5}, "workers must be an integer"),
        ({"gpus_per_worker": -1}, "gpus_per_worker must be at least 0"),
        ({"framework": "mxnet"}, "framework must be one of"),
        ({"backend": "lsf"}, "backend must be one of"),
        ({"env": ["NOEQUALS"]}, "KEY=VALUE"),
        ({"env": {"RANK": "3"}}, "RANK is set by mlcluster"),
        ({"env": {"1BAD": "x"}}, "not a valid environment variable name"),
        ({"env": {"MLCLUSTER_PAYLOAD": "/x"}}, "MLCLUSTER_PAYLOAD: MLCLUSTER_\\* names"),
        ({"env": {"MLCLUSTER_SESSION_PORT": "1"}}, "only MLCLUSTER_TENSORBOARD_DIR may be set"),
        ({"name": "Bad_Name"}, "name must be"),
        ({"cpus": 0}, "cpus must be greater than 0"),
        ({"wrokers": 3}, "unknown option"),
    ],
)
def test_spec_rejects(options, message):
    with pytest.raises(SpecError, match=message):
        JobSpec.from_options(options)


KEY = bytes(range(32))  # a job's record key


def test_output_parser_lines_control_and_tqdm():
    parser = OutputParser(KEY, 0)
    items = list(parser.feed(b"hello\nwor"))
    assert items == [("line", "hello")]
    record = encode_record({"type": "progress", "step": 3, "total": 10}, KEY, 0)
    items = list(parser.feed(b"ld\n" + record))
    assert items == [("line", "world"), ("control", {"type": "progress", "step": 3, "total": 10})]
    # tqdm redraws: progress from each redraw, only the final text becomes a log line
    items = list(parser.feed(b"\rtrain:  10%|#         | 10/100 [00:01<00:09, 10.00it/s]"))
    items += list(parser.feed(b"\rtrain:  50%|#####     | 50/100 [00:05<00:05, 10.00it/s]\r"))
    assert ("progress", {"step": 10, "total": 100, "desc": "train", "source": "tqdm"}) in items
    assert items[-1] == ("progress", {"step": 50, "total": 100, "desc": "train", "source": "tqdm"})
    assert not [i for i in items if i[0] == "line"]
    items = list(parser.feed(b"train: 100%|##########| 100/100 [00:10<00:00, 10.00it/s]\n"))
    assert items[-1] == ("line", "train: 100%|##########| 100/100 [00:10<00:00, 10.00it/s]")
    assert ("progress", {"step": 100, "total": 100, "desc": "train", "source": "tqdm"}) in items


def test_output_parser_takes_only_signed_records_at_line_start():
    """A record counts only at the start of a line, signed with the job's key by the rank
    whose stream it is; anything else that carries the marker is just a line of text."""
    genuine = encode_record({"type": "result", "index": 0, "count": 1, "data": "eA=="}, KEY, 0)
    forgeries = {
        "mid-line": b"dataset text: " + genuine,
        "other rank": encode_record({"type": "result", "index": 0, "count": 1}, KEY, 1),
        "other key": encode_record({"type": "result", "index": 0, "count": 1}, b"x" * 32, 0),
        "unsigned": MARKER.encode() + b'{"type":"result","index":0,"count":1,"data":"eA=="}\n',
        "tampered": genuine.replace(b"eA==", b"eB=="),
    }
    for name, data in forgeries.items():
        items = list(OutputParser(KEY, 0).feed(data))
        assert [kind for kind, _ in items] == ["line"], name
        assert items[0][1] == data[:-1].decode(), name
    assert list(OutputParser(None, 0).feed(genuine)) == [("line", genuine[:-1].decode())]
    assert list(OutputParser(KEY, 0).feed(genuine)) == [
        ("control", {"type": "result", "index": 0, "count": 1, "data": "eA=="})
    ]


def test_parse_tqdm_ignores_ordinary_text():
    assert parse_tqdm("loss 0.25 at step 10") is None
    assert parse_tqdm(" 45/100 [00:01<00:01]")["step"] == 45


def test_tensorboard_option_from_the_command_line_and_the_setting():
    import argparse

    from traitlets import TraitError

    from jupyterlab_mlcluster.config import MLClusterConfig
    from jupyterlab_mlcluster.jobs.model import tensorboard_dir_for
    from jupyterlab_mlcluster.jobs.options import add_job_arguments, spec_from_args

    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    spec = spec_from_args(parser.parse_args(["--tensorboard", "gs://b/{job}/tb"]))
    assert spec.tensorboard == "gs://b/{job}/tb"
    assert tensorboard_dir_for(spec.tensorboard, "j0123456789") == "gs://b/j0123456789/tb"
    assert tensorboard_dir_for("/r/{{x}}/{job}", "j1") == "/r/{x}/j1"
    with pytest.raises(SpecError, match="absolute path"):
        spec_from_args(parser.parse_args(["--tensorboard", "runs"]))
    assert MLClusterConfig(tensorboard_dir="/shared/{job}").tensorboard_dir == "/shared/{job}"
    with pytest.raises(TraitError, match="MLClusterConfig.tensorboard_dir"):
        MLClusterConfig(tensorboard_dir="/shared/{user}")
