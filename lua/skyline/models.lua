-- The batch-size models of an analysis document (docs/analysis-document.md, `models`). The
-- document's `predictions` hold every batch size it names; this formula (the engine's,
-- skyline_engine/predict/batch_models.py) is for the one the user has just chosen, so a key press
-- shows its numbers at once, without a round trip to the engine.
local M = {}

--- The prediction at batch size `b`: {batch_size, run_time_ms, samples_per_second,
--- peak_memory_bytes, fits}, or nil when the document has no models. samples_per_second is nil
--- where the run-time line is not positive: a line with a negative bias reaches zero there.
function M.predict(models, b)
  if not models then
    return nil
  end
  local time, memory = models.run_time_ms, models.peak_memory_bytes
  local run_time_ms = time.slope * b + time.bias
  local peak_memory_bytes = memory.slope * b + memory.bias
  return {
    batch_size = b,
    run_time_ms = run_time_ms,
    samples_per_second = run_time_ms > 0 and b / run_time_ms * 1000 or nil,
    peak_memory_bytes = peak_memory_bytes,
    fits = peak_memory_bytes <= models.usable_memory_bytes,
  }
end

--- The smallest batch size measured: below it the models are extrapolating.
function M.smallest_measured(models)
  local smallest
  for _, sample in ipairs(models.samples or {}) do
    smallest = math.min(smallest or sample.batch_size, sample.batch_size)
  end
  return smallest
end

return M
