-- :checkhealth skyline
local config = require('skyline.config')

local M = {}

local PROBE_TIMEOUT_MS = 60000

-- Run by the engine's interpreter: what the engine needs, without starting it.
local ENGINE_PROBE = [[
import json, sys
report = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import skyline_engine
    report["engine"] = skyline_engine.__version__
    report["engine_path"] = skyline_engine.__file__
except Exception as exc:
    report["engine_error"] = f"{type(exc).__name__}: {exc}"
try:
    import torch
    report["torch"] = torch.__version__
    report["cuda"] = torch.cuda.is_available()
    report["cuda_devices"] = torch.cuda.device_count() if report["cuda"] else 0
except Exception as exc:
    report["torch_error"] = f"{type(exc).__name__}: {exc}"
# What the engine imports as it starts (`skyline serve`, an analysis): each reported, so that a
# missing one is named here and not by every profile ("No module named 'msgpack'").
report["modules"] = {}
for name in ("numpy", "msgpack", "greenlet", "skyline_engine.service.engine", "skyline_engine.analysis.session"):
    try:
        module = __import__(name, fromlist=["_"])
        report["modules"][name] = getattr(module, "__version__", None) or "importable"
    except Exception as exc:
        report["modules"][name] = {"error": f"{type(exc).__name__}: {exc}"}
try:
    import pynvml
    pynvml.nvmlInit()
    report["nvml_devices"] = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
except Exception as exc:
    report["nvml_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(report))
]]

local HOST_PROBE = 'import sys, pynvim, msgpack; print(sys.version.split()[0], pynvim.__version__)'

-- The plugin's root: where rplugin/ and, in a checkout, skyline_engine/ are.
local function plugin_root()
  local init = vim.api.nvim_get_runtime_file('rplugin/python3/skyline_rplugin/__init__.py', false)[1]
  return init and vim.fs.dirname(vim.fs.dirname(vim.fs.dirname(vim.fs.dirname(init))))
end

-- Runs a command; returns its stdout, or nil and what went wrong.
local function run(cmd, env)
  local ok, process = pcall(vim.system, cmd, { text = true, env = env })
  if not ok then
    return nil, tostring(process)
  end
  local result = process:wait(PROBE_TIMEOUT_MS)
  if result.code ~= 0 then
    local why = vim.trim(result.stderr or '')
    local last = why:match('[^\n]*$')
    return nil, string.format('exit status %d%s', result.code, last ~= '' and (': ' .. last) or '')
  end
  return vim.trim(result.stdout)
end

local function check_neovim()
  local v = vim.version()
  local version = string.format('%d.%d.%d', v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.11') == 1 then
    vim.health.ok('Neovim ' .. version)
  else
    vim.health.error('Neovim ' .. version .. ' is too old', { 'skyline.nvim needs Neovim 0.11 or newer' })
  end
end

local function check_host()
  local host = vim.g.python3_host_prog
  if not host or host == '' then
    vim.health.warn('g:python3_host_prog is not set: Neovim looks for a python3 with pynvim on PATH', {
      'Set it to a Python that has pynvim, before plugins load: '
        .. 'vim.g.python3_host_prog = "/path/to/venv/bin/python"',
    })
    host = 'python3'
  end
  local out, why = run({ vim.fn.expand(host), '-c', HOST_PROBE })
  if out then
    local python, pynvim = out:match('^(%S+)%s+(%S+)$')
    vim.health.ok(string.format('python3 host %s: Python %s, pynvim %s', host, python or '?', pynvim or '?'))
  else
    vim.health.error('python3 host ' .. host .. ' cannot import pynvim and msgpack: ' .. why, {
      'Install them into that Python: python -m pip install pynvim',
    })
  end
end

local function check_registration()
  local manifest = vim.g.loaded_remote_plugins
  local text = type(manifest) == 'string'
      and vim.fn.filereadable(manifest) == 1
      and table.concat(vim.fn.readfile(manifest), '\n')
    or ''
  if text:find('skyline_rplugin', 1, true) and require('skyline.engine').registered('SkylineRpcProfile') then
    vim.health.ok('remote plugin registered in ' .. manifest)
  else
    local where = type(manifest) == 'string' and (' in ' .. manifest) or ''
    vim.health.error('the remote plugin is not registered' .. where, {
      'Run :UpdateRemotePlugins, then restart Neovim',
      'Do not lazy-load skyline.nvim by command: the manifest is built from the plugins on the runtimepath',
    })
  end
end

local function check_engine()
  local python = config.python() or vim.g.python3_host_prog or 'python3'
  local root = plugin_root()
  local env = root
      and {
        PYTHONPATH = table.concat(
          vim.tbl_filter(function(p)
            return p ~= nil and p ~= ''
          end, { root, os.getenv('PYTHONPATH') }),
          ':'
        ),
      }
    or nil
  local out, why = run({ vim.fn.expand(python), '-c', ENGINE_PROBE }, env)
  local ok, report = pcall(vim.json.decode, out or '')
  if not out or not ok then
    vim.health.error('engine interpreter ' .. python .. ' does not run: ' .. (why or 'no report'), {
      'Set g:skyline_python (or the `python` option) to a Python with torch, numpy and msgpack',
    })
    return
  end
  vim.health.info(string.format('engine interpreter: %s (Python %s)', report.executable, report.python))
  if report.engine then
    vim.health.ok(string.format('skyline_engine %s importable (%s)', report.engine, report.engine_path))
  else
    vim.health.error('skyline_engine is not importable: ' .. tostring(report.engine_error), {
      "Install the plugin's Python package into that interpreter: python -m pip install -e <plugin folder>",
    })
  end
  if report.torch then
    vim.health.ok('torch ' .. report.torch)
  else
    vim.health.error('torch is not importable: ' .. tostring(report.torch_error), {
      'Install torch into ' .. python,
    })
  end
  for _, name in ipairs({
    'numpy',
    'msgpack',
    'greenlet',
    'skyline_engine.service.engine',
    'skyline_engine.analysis.session',
  }) do
    local found = (report.modules or {})[name]
    if type(found) == 'string' then
      vim.health.ok(string.format('%s %s', name, found))
    else
      vim.health.error(string.format('%s is not importable: %s', name, tostring(found and found.error)), {
        'Install the missing package into '
          .. python
          .. ' (python -m pip install -e <plugin folder> installs them all)',
      })
    end
  end
  if report.cuda then
    vim.health.ok(string.format('CUDA available (%d device(s))', report.cuda_devices))
  elseif report.torch then
    vim.health.warn('CUDA is not available: analyses run on the CPU')
  end
  if report.nvml_devices then
    vim.health.ok(string.format('NVML available (%d device(s))', report.nvml_devices))
  else
    vim.health.info('NVML not available (' .. tostring(report.nvml_error) .. '): GPU memory capacity comes from torch')
  end
end

-- `:help skyline` needs the help tags of the plugin's doc/ folder: plugin managers make them, a
-- plain runtimepath install does not.
local function check_help_tags()
  local help = vim.api.nvim_get_runtime_file('doc/skyline.txt', false)[1]
  if not help then
    vim.health.warn('doc/skyline.txt is not on the runtimepath')
    return
  end
  local doc = vim.fs.dirname(help)
  if vim.fn.filereadable(vim.fs.joinpath(doc, 'tags')) == 1 then
    vim.health.ok('help tags in ' .. doc)
  else
    vim.health.warn('no help tags in ' .. doc .. ': `:help skyline` gives E149', {
      'Run :helptags ' .. vim.fn.fnamemodify(doc, ':~') .. ' (plugin managers do it for you)',
    })
  end
end

function M.check()
  vim.health.start('skyline.nvim')
  check_neovim()
  check_help_tags()
  vim.health.start('python3 host (the remote plugin)')
  check_host()
  check_registration()
  vim.health.start('engine')
  check_engine()
  vim.health.info('logs: ' .. require('skyline.engine').log_dir())
end

return M
