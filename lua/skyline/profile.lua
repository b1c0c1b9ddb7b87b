-- A profile from request to drawing.
--
-- start(): bump the generation, anchor the lines of every open project buffer (anchors.lua),
-- remember each buffer's changedtick, and ask the remote plugin for an analysis. The engine's
-- answer comes back as events (engine.on_message): `started` ties the generation to an analysis
-- id; later events count only for that id, so results of a superseded or stopped request are
-- dropped. A document is drawn at the anchored lines; a buffer that changed since the request
-- is drawn dimmed (stale), and lines deleted meanwhile are not drawn at all.
local anchors = require('skyline.anchors')
local config = require('skyline.config')
local diagnostics = require('skyline.diagnostics')
local engine = require('skyline.engine')
local models = require('skyline.models')
local project = require('skyline.project')
local virtual_text = require('skyline.virtual_text')
local state = require('skyline.state')
local util = require('skyline.util')

local M = {}

local function redraw_status()
  vim.cmd.redrawstatus({ bang = true })
end

local function fire(pattern, data)
  vim.api.nvim_exec_autocmds('User', { pattern = pattern, modeline = false, data = data })
end

local function current(event)
  local request = state.request
  return request ~= nil and not request.stopped and request.analysis_id == event.analysis_id
end

--- The buffer row where file line `line` (1-based) of `buf` is now, or nil when it is gone.
function M.row_of(buf, line)
  local request = state.request
  local seen = request and request.buffers[buf]
  if seen then
    return anchors.row(buf, seen.anchor, line)
  end
  if line <= vim.api.nvim_buf_line_count(buf) then
    return line - 1 -- opened after the request: its lines are the file's
  end
  return nil
end

local function changed_on_disk_since(path, wall)
  local stat = vim.uv.fs_stat(path)
  if not stat then
    return false
  end
  return stat.mtime.sec > wall.sec or (stat.mtime.sec == wall.sec and stat.mtime.nsec > wall.nsec)
end

-- Whether `buf` no longer shows what was profiled.
local function buffer_stale(buf, path)
  local request = state.request
  local seen = request.buffers[buf]
  if seen then
    return seen.anchor.differs or vim.api.nvim_buf_get_changedtick(buf) ~= seen.tick
  end
  return vim.bo[buf].modified or changed_on_disk_since(path, request.wall)
end

--- Draws the current document's costs in `buf` (if it is a file of the profiled project).
function M.draw_buffer(buf)
  local document, request = state.document, state.request
  local path = project.buffer_path(buf)
  local relative = document and path and project.relative(request.root, path)
  if not relative or not document.iteration then
    return
  end
  local totals = document.iteration
  local costs = config.get().costs
  local items = {}
  for _, record in ipairs(document.lines or {}) do
    if record.path == relative then
      local row = M.row_of(buf, record.line)
      local text, group = virtual_text.annotation(record, totals, costs)
      if row and text then
        table.insert(items, { row = row, text = text, group = group })
      end
    end
  end
  virtual_text.draw(buf, items, buffer_stale(buf, path))
end

local function draw_all()
  for _, buf in ipairs(project.buffers(state.request.root)) do
    M.draw_buffer(buf)
  end
end

-- The batch-size keys work in every buffer of the profiled project; the entry point's literal is
-- followed as the user edits it.
local function attach_batch(buf)
  local request, batch = state.request, require('skyline.batch')
  local path = project.buffer_path(buf)
  if not (request and path and project.relative(request.root, path)) then
    return
  end
  batch.set_keymaps(buf)
  if path == request.entry then
    batch.attach(buf)
  end
end

local save_profile = util.debounce(function()
  if state.request then
    M.start(state.request.entry, { quiet = true })
  end
end)

-- Buffers opened later get the current results; saving a project file re-profiles it.
local function watch_project_files()
  local group = vim.api.nvim_create_augroup('skyline.profile', { clear = true })
  vim.api.nvim_create_autocmd('BufReadPost', {
    group = group,
    pattern = '*.py',
    desc = 'skyline: annotate a project file opened after its profile',
    callback = function(args)
      if state.request then
        state.request.buffers[args.buf] = nil -- (re)read from disk: earlier anchors are gone
        M.draw_buffer(args.buf)
        attach_batch(args.buf)
      end
    end,
  })
  vim.api.nvim_create_autocmd('BufWritePost', {
    group = group,
    pattern = '*.py',
    desc = 'skyline: re-profile when a Python file of the project is written',
    callback = function(args)
      local path = project.buffer_path(args.buf)
      local opts = config.get()
      if opts.profile_on_save and state.request and path and project.relative(state.request.root, path) then
        save_profile.call(opts.save_debounce_ms)
      end
    end,
  })
end

local function forget_anchors(request)
  for buf in pairs(request and request.buffers or {}) do
    if vim.api.nvim_buf_is_valid(buf) then
      anchors.clear(buf)
    end
  end
end

-- A new request for `entry` in `root`, made current: every open project buffer anchored, its
-- changedtick remembered; results of earlier requests are dropped from now on.
local function begin(entry, root)
  forget_anchors(state.request)
  state.generation = state.generation + 1
  local request = {
    generation = state.generation,
    entry = entry,
    root = root,
    buffers = {},
    wall = vim.uv.clock_gettime('realtime'),
    started = vim.uv.hrtime(),
  }
  for _, buf in ipairs(project.buffers(root)) do
    local path = project.buffer_path(buf)
    request.buffers[buf] = {
      anchor = anchors.place(buf, path),
      tick = vim.api.nvim_buf_get_changedtick(buf),
      modified = vim.bo[buf].modified, -- unsaved changes: the engine reads another text
    }
  end
  state.request = request
  state.error = nil
  diagnostics.clear()
  watch_project_files()
  for _, buf in ipairs(project.buffers(root)) do
    attach_batch(buf)
  end
  return request
end

-- The message of the last failure the user was shown: the same failure again (each save while
-- the error stays) updates the diagnostic and the statusline, not the message area; a profile the
-- user asks for shows it again.
local last_failure = nil

--- Profiles the entry point `entry` (an absolute path). opts: batch_size (else the entry
--- buffer's literal, else the file's default), world_size (else the current request's, so that a
--- re-profile keeps the count of :[N]SkylineProfile, else the option), script_args (else the
--- current request's where it profiled the same file, else the option), quiet (no "profiling…"
--- message), instead (why this entry point and not the current buffer, said with that message).
function M.start(entry, opts)
  opts = opts or {}
  local world_size = opts.world_size or (state.request and state.request.world_size) or config.get().world_size
  local same_entry = state.request and state.request.entry == entry
  local script_args = opts.script_args or (same_entry and state.request.script_args) or config.get().script_args
  local root = project.root(entry)
  local relative = project.relative(root, entry)
  if not relative then
    util.error(string.format('the entry point %s is outside the project root %s', entry, root))
    return false
  end
  local batch = require('skyline.batch')
  local entry_buf = project.loaded_buffer(entry)
  local batch_size = opts.batch_size or (entry_buf and batch.literal_value(entry_buf))
  local request = begin(entry, root)
  request.world_size = world_size
  request.script_args = script_args
  state.running = true
  state.progress = { phase = 'starting', fraction = 0 }
  local sent = engine.profile(engine.spec(root), {
    request = request.generation,
    entry_point = relative,
    batch_size = batch_size,
    time_limit_s = config.get().time_limit_s,
    memory_capacity_bytes = util.parse_size(config.get().memory_capacity),
    world_size = world_size,
    -- A list, never a dict: an empty Lua table would otherwise reach msgpack as a map.
    script_args = #script_args > 0 and script_args or nil,
  })
  if not sent then
    state.running, state.progress = false, nil
    return false
  end
  if not opts.quiet then
    last_failure = nil
    util.notify('profiling ' .. relative .. (opts.instead and (' (' .. opts.instead .. ')') or ''))
  end
  redraw_status()
  return true
end

--- Stops the running profile; its results, if any still come, are dropped.
function M.stop()
  local request = state.request
  if not (request and state.running) then
    util.notify('nothing is being profiled')
    return
  end
  request.stopped = true
  state.running, state.progress = false, nil
  engine.cancel(request.generation)
  util.notify('profiling stopped')
  redraw_status()
end

-- The profile failed: one line in the message area, the annotations dimmed (and removed at
-- `rows`, {[buf] = row}: the lines where it failed) until the next result.
local function fail(message, kind, rows)
  state.running, state.progress = false, nil
  state.error = message
  virtual_text.mark_all_stale(rows or {})
  if message ~= last_failure then
    last_failure = message
    util.error(message)
  end
  fire('SkylineProfileFailed', { message = message, kind = kind })
  redraw_status()
end

-- "2,404 samples/s · 10.9 MiB peak · 6.1 s": what an analysis found, and how long it took.
local function summary(request, document)
  local format = require('skyline.format')
  local iteration = document.iteration
  local text = string.format(
    '%s at batch size %s · %s peak',
    format.throughput(iteration.samples_per_second),
    format.integer(document.batch_size),
    format.bytes(iteration.peak_memory_bytes)
  )
  if request.started then
    text = text .. string.format(' · %.1f s', (vim.uv.hrtime() - request.started) / 1e9)
  end
  return text
end

-- A document arrived: the partial one (the user's batch size measured) or the complete one.
local function apply(document, complete)
  local batch = require('skyline.batch')
  state.document = document
  state.measured = state.measurement(document)
  if complete and document.models then
    state.models, state.predictions = document.models, document.predictions
    state.models_batch_size = document.batch_size
  end
  -- The batch size shown is the buffer's: a key press or an edit may have changed it meanwhile.
  local entry_buf = project.loaded_buffer(state.request.entry)
  state.batch_size = entry_buf and batch.literal_value(entry_buf) or document.batch_size
  state.prediction = models.at(state.models, state.batch_size)
  draw_all()
  batch.show_hint()
  require('skyline.float').refresh()
  if complete then
    state.running, state.progress = false, nil
    last_failure = nil
    if document.memory_growth then
      local root = state.request.root
      diagnostics.show_growth(document.memory_growth, function(path)
        return project.absolute(root, path)
      end, M.row_of)
    end
    util.notify(summary(state.request, document))
    fire('SkylineProfileDone', {
      entry_point = state.request.entry,
      analysis_id = state.request.analysis_id,
      batch_size = document.batch_size,
    })
  end
  redraw_status()
end

--- Shows `document`, an analysis document that did not come from this editor's engine (a report
--- written by `skyline profile --json`), as if the entry point it names had just been profiled.
function M.show(document)
  local entry = vim.fs.joinpath(document.project_root, document.entry_point)
  begin(entry, document.project_root).started = nil -- no time to report: not analysed here
  state.running, state.progress = false, nil
  apply(document, true)
end

function M.on_connected(event)
  state.engine = event
  if event.device_error then
    util.warn('the engine found no usable device: ' .. event.device_error)
  end
  if event.remote and state.remote then
    local device = event.device and event.device.name or 'unknown device'
    local remote = state.remote
    util.notify(string.format('connected to the engine at %s:%s (%s)', remote.host, remote.port, device))
  end
end

function M.on_started(event)
  local request = state.request
  if request and not request.stopped and request.generation == event.request then
    request.analysis_id = event.analysis_id
  end
end

function M.on_progress(event)
  if current(event) then
    state.progress = { phase = event.phase, fraction = event.fraction }
    redraw_status()
  end
end

function M.on_analysis(event)
  if current(event) then
    apply(event.document, not event.partial)
  end
end

function M.on_analysis_error(event)
  if not current(event) then
    return -- superseded, or stopped: the user knows
  end
  -- Pseudo-files such as `<frozen runpy>` have no buffer: the engine can name them as frames.
  local rows = {}
  if event.path and event.line and not event.path:match('^<') then
    local buf, row =
      diagnostics.show(project.absolute(state.request.root, event.path), event.line, event.message, M.row_of)
    rows[buf] = row
  end
  fail(event.message, event.kind, rows)
end

function M.on_request_error(event)
  local request = state.request
  if request and request.generation == event.request then
    fail('the engine refused the request: ' .. tostring(event.message), event.code)
  end
end

function M.on_engine_error(event)
  local message = event.message .. (event.ended and '; the next profile starts it again' or '')
  if state.running then
    fail(message, 'engine')
  else
    util.error(message)
  end
end

--- Hides the costs drawn in `buf`, or shows them again (they follow later results as ever).
function M.toggle_buffer(buf)
  vim.b[buf].skyline_hidden = not virtual_text.hidden(buf)
  if virtual_text.hidden(buf) then
    vim.api.nvim_buf_clear_namespace(buf, virtual_text.ns, 0, -1)
  else
    M.draw_buffer(buf)
  end
  util.notify(virtual_text.hidden(buf) and 'costs hidden in this buffer' or 'costs shown in this buffer')
end

--- Removes every annotation, diagnostic and hint; results (and profiling on save) are
--- forgotten until the next :SkylineProfile.
function M.clear()
  if state.running then
    M.stop()
  end
  forget_anchors(state.request)
  state.request = nil
  virtual_text.clear_all()
  diagnostics.clear()
  require('skyline.batch').clear_hint()
  require('skyline.float').close()
  state.document, state.models, state.predictions, state.measured = nil, nil, nil, nil
  state.models_batch_size = nil
  state.prediction, state.batch_size = nil, nil
  state.error = nil
  redraw_status()
end

return M
