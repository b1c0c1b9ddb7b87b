-- The batch-size models of an analysis document (docs/analysis-document.md, `models`). The
-- document's `predictions` hold every batch size it names; this formula (the engine's,
-- skyline_engine/predict/batch_models.py) is for the one the user has just chosen, so a key press
-- shows its numbers at once, without a round trip to the engine.
local M = {}

--- The predicted peak memory at batch size `b`: the highest of the model's curves (`phases`),
--- each `quadratic * b^2 + slope * b + bias` (`quadratic` absent or 0 for a line), computed as the
--- engine does so that both give the same bytes.
function M.peak_memory(memory, b)
  local lines = (memory.phases and #memory.phases > 0) and memory.phases or { memory }
  local peak = -math.huge
  for _, line in ipairs(lines) do
    peak = math.max(peak, ((line.quadratic or 0) * b + line.slope) * b + line.bias)
  end
  return peak
end

--- What ends the trusted range (`models.trusted_range`), as a message names it: the engine's
--- BatchSizeModels.trusted_range_end.
function M.trusted_range_end(models)
  local end_ = models.trusted_range[2]
  if vim.tbl_contains(models.failing_batch_sizes or {}, end_ + 1) then
    return string.format('the batch size below %d, where your code fails', end_ + 1)
  end
  if models.line_bends_at then
    return string.format(
      'the largest measured: throughput at %d did not follow the run-time line',
      models.line_bends_at
    )
  end
  if models.range_unprobed then
    return 'the largest measured: no batch size past it was timed precisely enough to check the run-time line'
  end
  if end_ == models.range_probed_to then
    return string.format('the probe at %d: the run-time line is unchecked past it', end_)
  end
  if end_ == models.samples_per_step then
    return 'the samples per optimizer step, beyond which a step runs less than one micro-batch'
  end
  for _, line in ipairs(models.peak_memory_bytes.phases or {}) do
    if (line.quadratic or 0) > 0 then
      return 'the largest measured: memory grows with the batch size squared'
    end
  end
  return '4× the largest measured'
end

--- Whether the run-time line predicts anything: it grows with the batch size and fits the
--- measurements (where its fit can be judged: R², or every time within CLOSE_FIT_RESIDUAL).
function M.time_predictable(time)
  local constants = require('skyline.constants')
  return time.slope > 0
    and (
      time.r2 == nil
      or time.r2 >= constants.POOR_FIT_R2
      or (time.max_relative_residual or math.huge) <= constants.CLOSE_FIT_RESIDUAL
    )
end

--- The run-time line's time at batch size `b` (ms; one micro-batch's with `samples_per_step`),
--- corrected past the largest timed batch size toward the checks timed there (those precise to
--- MAX_SPREAD), as the engine's
--- BatchSizeModels.run_time_at does: between two of them (the first from the line's own time at
--- the largest timed), on the straight segment through them; beyond the last, the line moved by
--- the last one's miss.
---@param models skyline.Models
---@param b integer
---@return number
function M.run_time_at(models, b)
  local time = models.run_time_ms
  local function line(x)
    return time.slope * x + time.bias
  end
  local largest = -math.huge
  for _, sample in ipairs(models.samples or {}) do
    largest = math.max(largest, sample.batch_size)
  end
  local per_step = models.samples_per_step ~= vim.NIL and models.samples_per_step or nil
  local max_spread = require('skyline.constants').MAX_SPREAD
  local anchors = {}
  for _, check in ipairs(models.checks or {}) do
    if check.batch_size > largest and (check.run_time_iqr_ms or 0) <= max_spread * check.run_time_ms then
      -- With samples per step the line is one micro-batch's time, and so is the check's in it.
      local ms = per_step and check.run_time_ms / (check.micro_batches or 1) or check.run_time_ms
      table.insert(anchors, { check.batch_size, ms })
    end
  end
  if #anchors == 0 or b <= largest then
    return line(b)
  end
  table.sort(anchors, function(x, y)
    return x[1] < y[1]
  end)
  table.insert(anchors, 1, { largest, line(largest) })
  for i = 2, #anchors do
    local low, high = anchors[i - 1], anchors[i]
    if b <= high[1] then
      return low[2] + (high[2] - low[2]) * (b - low[1]) / (high[1] - low[1])
    end
  end
  local last = anchors[#anchors]
  return line(b) + last[2] - line(last[1])
end

--- The figures at one batch size, as `predict` and `at` give them.
---@class skyline.Figures
---@field batch_size integer
---@field run_time_ms number? nil where the run-time line predicts nothing
---@field samples_per_second number? nil with `run_time_ms`
---@field peak_memory_bytes number
---@field fits boolean
---@field extrapolated boolean outside `models.trusted_range`
---@field measured boolean? `at`: the document measured this batch size (its other fields are the measurement's)

--- The prediction at batch size `b`: {batch_size, run_time_ms, samples_per_second,
--- peak_memory_bytes, fits, extrapolated}, or nil when the document has no models. No time and
--- no throughput (nil) where the run-time line is not positive, or predicts nothing at all.
---@param models skyline.Models?
---@param b integer
---@return skyline.Figures?
function M.predict(models, b)
  if not models then
    return nil
  end
  local time = models.run_time_ms
  local run_time_ms = M.run_time_at(models, b)
  if not M.time_predictable(time) or run_time_ms <= 0 then
    run_time_ms = nil
  end
  local peak_memory_bytes = M.peak_memory(models.peak_memory_bytes, b)
  local low, high = unpack(models.trusted_range)
  -- Gradient accumulation: `micro_batches` of b samples per iteration.
  local samples_per_second = run_time_ms and (models.micro_batches or 1) * b / run_time_ms * 1000 or nil
  local per_step = models.samples_per_step ~= vim.NIL and models.samples_per_step or nil
  if per_step and b > per_step then
    -- Less than one micro-batch a step: no iteration the user's code runs.
    run_time_ms, samples_per_second = nil, nil
  elseif run_time_ms and per_step then
    -- A fixed number of samples per step: the line is one micro-batch's, and b runs
    -- samples_per_step / b of them.
    run_time_ms = run_time_ms * per_step / b
  end
  return {
    batch_size = b,
    run_time_ms = run_time_ms,
    samples_per_second = samples_per_second,
    peak_memory_bytes = peak_memory_bytes,
    fits = peak_memory_bytes <= models.usable_memory_bytes,
    extrapolated = b < low or b > high,
  }
end

--- The figures at batch size `b` as every part of the editor shows them: where the document
--- measured `b` (`models.samples`, else `models.checks`: timed beside the user's after the models
--- were fitted), that measurement, marked `measured` (it ran: it fits); elsewhere the prediction.
--- Nil when the document has no models.
---@param models skyline.Models?
---@param b integer
---@return skyline.Figures?
function M.at(models, b)
  if not models then
    return nil
  end
  for _, measured in ipairs({ models.samples or {}, models.checks or {} }) do
    for _, sample in ipairs(measured) do
      if sample.batch_size == b then
        return vim.tbl_extend('force', sample, { measured = true, fits = true, extrapolated = false })
      end
    end
  end
  return M.predict(models, b)
end

return M
