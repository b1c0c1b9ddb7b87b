"""What the service says when the user's code interrupts itself, runs out of a worker's memory
limit, or names a file it may not read (#12 item 7).

One real service (stdio) for the module, its workers limited to 3 GiB of address space, as a user
would run it with `--worker-memory-limit 3G`. The entry points are written into a copy of the
service's test project; the lines the errors must name carry a `# <- HERE` marker.
"""

from __future__ import annotations

import pytest

from engine_helpers import marked_line
from service_client import ServiceProcess, copy_project

pytestmark = pytest.mark.timeout(180)

WORKER_MEMORY_LIMIT = "3G"

PROVIDERS = """\
import torch

from model import TinyModel


def skyline_model_provider():
    return TinyModel()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 8),)


def skyline_iteration_provider(model):
    def iteration(x):
        {body}
        model(x).backward()

    return iteration
"""

# Raised by the user's own code, as a library that turns SIGINT into an exception would.
INTERRUPTS = PROVIDERS.format(body="raise KeyboardInterrupt  # <- HERE")
# 4 GiB of address space, more than the worker's limit and less than the machine's memory; never
# touched, so the allocation fails at once and costs nothing when it would succeed.
ALLOCATES = PROVIDERS.format(body="torch.empty(4 * 2**30, dtype=torch.uint8)  # <- HERE")
# 512 MiB of address space kept each iteration (never touched: it costs nothing but the limit):
# the sixth or so runs out of the worker's 3 GiB, at any batch size.
LEAKS = """\
import torch

from model import TinyModel


def skyline_model_provider():
    return TinyModel()


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 8),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []

    def iteration(x):
        kept.append(torch.empty(2**29, dtype=torch.uint8))  # <- HERE
        model(x).pow(2).mean().backward()
        optimizer.step()

    return iteration
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = copy_project(tmp_path_factory.mktemp("messages"))
    for name, source in (("interrupts", INTERRUPTS), ("over_limit", ALLOCATES), ("leaks", LEAKS)):
        (root / name).mkdir()
        (root / name / "entry_point.py").write_text(source)
        (root / name / "model.py").write_text((root / "tiny" / "model.py").read_text())
    return root


@pytest.fixture(scope="module")
def client(root):
    service = ServiceProcess(root, "--quick", "--worker-memory-limit", WORKER_MEMORY_LIMIT)
    client = service.stdio_client()
    client.initialize()
    yield client
    service.stop()


def test_a_keyboard_interrupt_raised_by_user_code_is_the_users_error(client, root):
    _, method, error = client.analyze("interrupts/entry_point.py")
    assert method == "analysis_error"
    assert error["kind"] == "user_code", error
    assert error["path"] == "interrupts/entry_point.py"
    assert error["line"] == marked_line(root / "interrupts/entry_point.py")
    assert error["message"].startswith(f"interrupts/entry_point.py:{error['line']}: KeyboardInterrupt")
    assert "internal" not in error["message"]


def test_out_of_memory_under_the_worker_memory_limit_names_the_limit_and_the_line(client, root):
    _, method, error = client.analyze("over_limit/entry_point.py")
    assert method == "analysis_error"
    assert error["kind"] == "out_of_memory", error
    message = error["message"]
    assert "does not fit in the memory limit of 3.0 GiB (--worker-memory-limit)" in message, message
    line = marked_line(root / "over_limit/entry_point.py")
    assert f"over_limit/entry_point.py:{line}" in message, message
    assert "): \n" not in message and not message.rstrip().endswith(":"), message  # a reason is given
    assert message.count("--worker-memory-limit") == 1, message  # said once, not again in a note


def test_memory_that_grows_each_iteration_is_not_told_to_lower_the_batch_size(client, root):
    # It had been "batch size 16 does not fit … Lower the batch size", though 16 ran several
    # iterations and a smaller one would run out as well, only later.
    _, method, error = client.analyze("leaks/entry_point.py")
    assert method == "analysis_error" and error["kind"] == "out_of_memory", error
    line = marked_line(root / "leaks/entry_point.py")
    assert (error["path"], error["line"]) == ("leaks/entry_point.py", line)
    message = error["message"]
    assert "batch size 16 ran " in message and "then ran out of the memory limit of 3.0 GiB" in message, message
    assert "Memory grew with every iteration" in message and "Lower the batch size" not in message
    assert "Keep no tensors across iterations" in message


@pytest.mark.parametrize(
    "outside",
    [
        pytest.param(("../outside_exists.py", "../no_such_file.py"), id="relative"),
        pytest.param(("{tmp}/outside_exists.py", "{tmp}/no_such_folder/no_such_file.py"), id="absolute"),
    ],
)
def test_paths_outside_the_root_get_one_answer_whether_or_not_they_exist(client, root, outside):
    """The answer for a path outside the project root must not tell whether it exists there."""
    (root.parent / "outside_exists.py").write_text("x = 1\n")
    answers = []
    for template in outside:
        entry = template.format(tmp=root.parent)
        _, method, error = client.analyze(entry)
        assert method == "analysis_error"
        answers.append((error["kind"], error["path"], error["line"], error["message"].replace(repr(entry), "ENTRY")))
    assert answers[0] == answers[1]
    kind, _, _, message = answers[0]
    assert kind == "entry_point"
    assert "outside the project root" in message
    assert "exist" not in message and "not a file" not in message


def test_a_path_component_longer_than_the_file_system_allows_is_the_entry_points_error(client):
    # 4,000 bytes pass the protocol's 4,096-byte bound, but no file system takes such a name:
    # the open failed as an `internal` error ("File name too long").
    entry = "a" * 4000 + ".py"
    _, method, error = client.analyze(entry)
    assert method == "analysis_error" and error["kind"] == "entry_point"
    assert error["message"].endswith("cannot be opened: File name too long.") and len(error["message"]) < 200
