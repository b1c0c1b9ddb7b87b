-- The session's state: the current request, the latest document, the batch size with its
-- prediction and measurement. One table, shared by the modules; `snapshot()` is the public copy
-- behind require('skyline').state().
local M = {
  generation = 0, -- bumped by every request; events of older generations are dropped
  request = nil, -- see profile.lua: {generation, entry, root, analysis_id, buffers, ...}
  document = nil, -- the latest document of the current request (partial or complete)
  models = nil, -- the batch-size models of the latest complete document that had them
  models_batch_size = nil, -- that document's batch size (the user's, for its recommendation)
  predictions = nil, -- that document's `predictions`: the chart's rows
  running = false,
  progress = nil, -- {phase, fraction}
  batch_size = nil, -- the batch size shown: the document's, or the one a key press set
  prediction = nil, -- models.predict() at batch_size
  measured = nil, -- the document's `iteration` (at document.batch_size)
  error = nil, -- the message of the last failed request
  engine = nil, -- what `initialize` answered: {engine_version, device, pid, remote, ...}
  remote = nil, -- {host, port, token} after :SkylineConnect
}

--- The measurement of `document` in the shape state() returns.
function M.measurement(document)
  local iteration = document.iteration
  return {
    batch_size = document.batch_size,
    samples_per_second = iteration.samples_per_second,
    peak_memory_bytes = iteration.peak_memory_bytes,
    run_time_ms = iteration.run_time_ms,
  }
end

--- Whether what is shown no longer describes the code: an annotated buffer changed since its
--- request, or the batch size was changed since the measurement.
function M.is_stale()
  if require('skyline.virtual_text').any_stale() then
    return true
  end
  return M.document ~= nil and M.batch_size ~= M.document.batch_size
end

function M.snapshot()
  return vim.deepcopy({
    batch_size = M.batch_size,
    prediction = M.prediction,
    measured = M.measured,
    stale = M.is_stale(),
    running = M.running,
    progress = M.progress,
    error = M.error,
    entry_point = M.request and M.request.entry,
    analysis_id = M.request and M.request.analysis_id,
  })
end

return M
