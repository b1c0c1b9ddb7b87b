"""The plugin in a real Neovim, without running an analysis: registration, commands, options,
help, health, highlights, and bad input before any result exists."""

import re
import shutil
import subprocess
import sys

import pytest

from nvim_helpers import (
    REPO,
    assert_no_traceback,
    nvim_binary,
    state,
    wait_for_message,
)

pytestmark = pytest.mark.slow  # Neovim, and the remote plugin's Python in a subprocess

COMMANDS = ["SkylineProfile", "SkylineStop", "SkylineBreakdown", "SkylineBatchSize", "SkylineConnect", "SkylineClear"]
PLUGS = [
    "<Plug>(skyline-batch-inc)",
    "<Plug>(skyline-batch-dec)",
    "<Plug>(skyline-profile)",
    "<Plug>(skyline-breakdown)",
]


def test_the_manifest_registers_the_remote_plugin(nvim, nvim_session):
    manifest = nvim_session.manifest.read_text()
    assert "rplugin/python3/skyline_rplugin" in manifest
    for function in ("SkylineRpcProfile", "SkylineRpcCancel", "SkylineRpcConnect"):
        assert f"'name': '{function}'" in manifest
        assert nvim.exec_lua("return require('skyline.engine').registered(...)", function)
    assert "'sync': v:true" not in manifest  # every handler is asynchronous


def test_commands_and_plug_maps_exist_without_setup(nvim):
    for command in COMMANDS:
        assert nvim.funcs.exists(f":{command}") == 2, command
    for plug in PLUGS:
        assert nvim.funcs.maparg(plug, "n") != "", plug
    # Loading the plugin loads none of its modules: they load when first used.
    assert nvim.exec_lua("return package.loaded['skyline.profile'] == nil")
    assert nvim.funcs.maparg("<C-a>", "n") == "" and nvim.funcs.maparg("<C-x>", "n") == ""


def test_command_completion(nvim):
    assert "max" in nvim.funcs.getcompletion("SkylineBatchSize ", "cmdline")
    assert "local" in nvim.funcs.getcompletion("SkylineConnect ", "cmdline")
    entries = nvim.funcs.getcompletion(f"SkylineProfile {REPO}/examples/default/", "cmdline")
    assert any(entry.endswith("entry_point.py") for entry in entries)
    assert not any(entry.endswith(".md") for entry in entries)


@pytest.mark.parametrize(
    "options, key",
    [
        ({"virt_text_pos": "inline"}, "virt_text_pos"),
        ({"batch_step": 0}, "batch_step"),
        ({"keymaps": {"batch_inc": 3}}, "keymaps.batch_inc"),
        ({"cost_thresholds": {"high": 2}}, "cost_thresholds.high"),
        ({"memory_capacity": "lots"}, "memory_capacity"),
        ({"engine_args": "--quick"}, "engine_args"),
        ({"profile_on_save": "yes"}, "profile_on_save"),
    ],
)
def test_setup_names_the_offending_option(nvim, options, key):
    assert nvim.exec_lua("return require('skyline').setup(...)", options) is False
    text = wait_for_message(nvim, f"setup: {key}:")
    assert_no_traceback(nvim)
    assert "expected" in text


def test_setup_accepts_options_and_warns_about_unknown_ones(nvim):
    assert nvim.exec_lua("return require('skyline').setup({virt_text_pos = 'eol', keymaps = false, colour = 1})")
    wait_for_message(nvim, "unknown options ignored: colour")
    assert nvim.exec_lua("return require('skyline.config').get().virt_text_pos") == "eol"
    assert nvim.exec_lua("return require('skyline.config').get().keymaps") is False


def test_highlights_are_default_links_and_survive_colorschemes(nvim):
    nvim.command("highlight SkylineCostHigh guifg=#ff0000")  # the user's own, defined first
    nvim.exec_lua("require('skyline.highlights').setup()")
    assert nvim.api.get_hl(0, {"name": "SkylineCostMid"})["link"] == "DiagnosticWarn"
    assert "link" not in nvim.api.get_hl(0, {"name": "SkylineCostHigh"})
    nvim.command("colorscheme default")
    assert nvim.api.get_hl(0, {"name": "SkylineStale"})["link"] == "NonText"


@pytest.mark.parametrize(
    "command, message",
    [
        ("SkylineBatchSize 0", "no results yet"),
        ("SkylineBatchSize -5", "no results yet"),
        ("SkylineBatchSize abc", "no results yet"),
        ("SkylineBreakdown", "no results yet"),
        ("SkylineStop", "nothing is being profiled"),
        ("SkylineProfile no/such/entry_point.py", "entry point not found: no/such/entry_point.py"),
        ("SkylineConnect nowhere", "expected HOST:PORT"),
        ("SkylineConnect 127.0.0.1:1 /no/such/token", "cannot read a token from /no/such/token"),
    ],
)
def test_bad_commands_give_a_message_not_a_traceback(nvim, command, message):
    nvim.command(command)
    wait_for_message(nvim, message)
    assert_no_traceback(nvim)


def test_batch_keys_before_any_result_explain_why(nvim, project):
    nvim.command(f"edit {project}/entry_point.py")
    nvim.input("3<Plug>(skyline-batch-inc)")
    wait_for_message(nvim, "no results yet: run :SkylineProfile first")
    assert "batch_size=128" in nvim.current.buffer[11]  # untouched
    assert_no_traceback(nvim)


def test_profile_refuses_a_buffer_that_is_not_python(nvim, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("not python\n")
    nvim.command(f"edit {notes}")
    nvim.command("SkylineProfile")
    wait_for_message(nvim, "not a Python buffer: :SkylineProfile path/to/train.py")
    nvim.command(f"edit {tmp_path / 'helpers.py'}")
    nvim.command("SkylineProfile")
    wait_for_message(nvim, "this buffer neither trains (no optimizer step) nor defines skyline_model_provider")
    # A configured entry point that is not there is said to be missing (it was a message of nil).
    nvim.exec_lua("require('skyline').setup({entry_point = 'no/such/configured.py'})")
    nvim.command("SkylineProfile")
    wait_for_message(nvim, "entry point not found: no/such/configured.py")
    assert_no_traceback(nvim)
    assert state(nvim)["running"] is False


def test_checkhealth_reports_no_error(nvim, tmp_path):
    nvim.command("checkhealth skyline")
    report = "\n".join(nvim.current.buffer[:])
    assert "skyline.nvim" in report
    assert "ERROR" not in report, report
    for expected in ("Neovim 0.11", "pynvim", "remote plugin registered", "skyline_engine", "torch "):
        assert expected in report, report
    assert re.search(r"CUDA (available|is not available)", report), report
    assert "NVML" in report


def test_checkhealth_names_a_module_the_engine_cannot_import(nvim, tmp_path):
    # An engine interpreter with torch and numpy but no msgpack passed every check, and every
    # profile then failed with "No module named 'msgpack'". Its absence is made here by a module
    # first on PYTHONPATH that raises as a missing one does (the probe keeps the environment's path).
    blocker = tmp_path / "no_msgpack"
    blocker.mkdir()
    (blocker / "msgpack.py").write_text("raise ModuleNotFoundError(\"No module named 'msgpack'\")\n")
    nvim.exec_lua("vim.env.PYTHONPATH = ...", str(blocker))
    nvim.command("checkhealth skyline")
    report = "\n".join(nvim.current.buffer[:])
    assert "msgpack is not importable: ModuleNotFoundError: No module named 'msgpack'" in report, report
    assert "numpy " in report and "torch " in report  # the others, each reported


def test_help_tags_generate_and_cover_everything(nvim, tmp_path):
    doc = tmp_path / "doc"
    shutil.copytree(REPO / "doc", doc)  # :helptags writes doc/tags: not into the checkout
    result = subprocess.run(
        [nvim_binary(), "--headless", "-u", "NONE", "-i", "NONE", "-n", "+helptags " + str(doc), "+qa"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and "E154" not in result.stderr + result.stdout, result.stderr
    tags = {line.split("\t")[0] for line in (doc / "tags").read_text().splitlines()}
    options = nvim.exec_lua(OPTION_NAMES)
    groups = nvim.exec_lua("return vim.tbl_map(function(g) return g[1] end, require('skyline.highlights').GROUPS)")
    wanted = [f":{c}" for c in COMMANDS] + PLUGS + [f"skyline-option-{o}" for o in options] + groups
    wanted += ["skyline.txt", "skyline-health", "skyline.status()", "skyline.state()", "SkylineProfileDone"]
    missing = [tag for tag in wanted if tag not in tags]
    assert not missing, missing


OPTION_NAMES = "return vim.tbl_map(function(o) return o.name end, require('skyline.config').schema)"


def test_the_help_lists_every_option_with_its_default(nvim):
    help_text = (REPO / "doc" / "skyline.txt").read_text()
    schema = nvim.exec_lua(OPTION_NAMES)
    tagged = re.findall(r"\*skyline-option-([a-z_]+)\*", help_text)
    assert sorted(tagged) == sorted(schema)  # every option, and none the schema lacks
    # The defaults block of section 5, one `name = value,` line per option, in the schema's order.
    lines = help_text.splitlines()
    start = lines.index("    require('skyline').setup({") + 1
    block = lines[start : lines.index("    })", start)]
    assert [re.match(r"\s*(\w+) = ", line).group(1) for line in block] == schema
    stated = nvim.exec_lua("return assert(loadstring('return {' .. ... .. '}'))()", "\n".join(block))
    assert stated == nvim.exec_lua("return require('skyline.config').defaults")
    # Each option's own entry follows its tag.
    for name in schema:
        assert re.search(rf"\*skyline-option-{name}\*.*\n{name} +\(", help_text), name


def test_the_remote_plugin_imports_neither_torch_nor_the_engine():
    # The python3 host imports every remote plugin before it answers Neovim: heavy imports
    # would freeze the editor, and torch belongs to the engine's own process.
    code = (
        "import sys; sys.path.insert(0, 'rplugin/python3'); import skyline_rplugin; "
        "heavy = [m for m in ('torch', 'numpy', 'skyline_engine') if m in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_messages_stay_one_line_at_80_columns_and_raise_no_prompt(nvim, tmp_path):
    # Several messages in one tick, some wider than the room beside 'showcmd' and 'ruler' (68
    # cells at 80 columns): one line, cut short, its messages whole in the plugin's log.
    nvim.options["columns"] = 80
    nvim.command("enew")  # no Python file
    commands = [
        "SkylineProfile",
        "SkylineProfile a.py b.py",
        "SkylineBatchSize 8",
        f"SkylineConnect 127.0.0.1:1 {tmp_path}/no/such/token/file/anywhere/at/all",
    ]
    nvim.exec_lua("for _, command in ipairs(...) do vim.cmd(command) end", commands)  # in one tick
    text = wait_for_message(nvim, "cannot read a token from")
    mode = nvim.api.get_mode()
    assert mode["mode"] == "n" and not mode["blocking"]  # no hit-enter prompt ('r')
    shown = nvim.exec_lua("return vim.api.nvim_exec2('messages', {output = true}).output").splitlines()
    (line,) = [line for line in shown if line.startswith("skyline: ")]
    assert nvim.funcs.strdisplaywidth(line) < nvim.vvars["echospace"] and line.endswith(" …")
    assert line.startswith("skyline: not a Python buffer") and "no results yet" not in line  # the first lead
    # The whole of each, in the log.
    for whole in ("its own arguments go after `--`", "no results yet", f"{tmp_path}/no/such/token"):
        assert whole in text
    assert_no_traceback(nvim)
