-- skyline.models: the batch-size models' formula, as docs/analysis-document.md gives it.
local eq = require('lua_units').eq
local models = require('skyline.models')

local cases = {}

local MODELS = {
  run_time_ms = { slope = 2.0, bias = 4.0 },
  peak_memory_bytes = { slope = 1000.0, bias = 5000.0 },
  usable_memory_bytes = 13000,
  trusted_range = { 8, 128 },
}
local NEGATIVE_BIAS = {
  run_time_ms = { slope = 1.0, bias = -10.0 },
  peak_memory_bytes = { slope = 10.0, bias = -100.0 },
  usable_memory_bytes = 0,
  trusted_range = { 1, 100 },
}
-- The peak is the highest of the phases' lines: the optimizer's (flat, 9000 bytes) up to 4
-- samples, the forward and backward passes' (2000 a sample, 1000 more) above.
local PHASES = {
  run_time_ms = { slope = 0.0, bias = 3.0 },
  peak_memory_bytes = {
    slope = 2000.0,
    bias = 1000.0,
    phases = {
      { name = 'optimizer', slope = 0.0, bias = 9000.0 },
      { name = 'forward_backward', slope = 2000.0, bias = 1000.0 },
    },
  },
  usable_memory_bytes = 11000,
  trusted_range = { 2, 16 },
}

function cases.the_models_formula()
  local expected = {
    -- 2*8+4 = 20 ms: 8/20*1000 = 400 samples/s; 1000*8+5000 = 13000 bytes, just fits
    {
      MODELS,
      8,
      {
        batch_size = 8,
        run_time_ms = 20,
        samples_per_second = 400,
        peak_memory_bytes = 13000,
        fits = true,
        extrapolated = false,
      },
    },
    {
      MODELS,
      9,
      {
        batch_size = 9,
        run_time_ms = 22,
        samples_per_second = 9 / 22 * 1000,
        peak_memory_bytes = 14000,
        fits = false,
        extrapolated = false,
      },
    },
    {
      MODELS,
      200,
      {
        batch_size = 200,
        run_time_ms = 404,
        samples_per_second = 200 / 404 * 1000,
        peak_memory_bytes = 205000,
        fits = false,
        extrapolated = true,
      },
    },
    -- a run time that is not positive has no time and no throughput (nil), never a negative one
    { NEGATIVE_BIAS, 5, { batch_size = 5, peak_memory_bytes = -50, fits = true, extrapolated = false } },
    { NEGATIVE_BIAS, 10, { batch_size = 10, peak_memory_bytes = 0, fits = true, extrapolated = false } },
    {
      NEGATIVE_BIAS,
      20,
      {
        batch_size = 20,
        run_time_ms = 10,
        samples_per_second = 2000,
        peak_memory_bytes = 100,
        fits = false,
        extrapolated = false,
      },
    },
    -- a time that does not grow with the batch size predicts no time at all
    { PHASES, 1, { batch_size = 1, peak_memory_bytes = 9000, fits = true, extrapolated = true } },
    { PHASES, 4, { batch_size = 4, peak_memory_bytes = 9000, fits = true, extrapolated = false } },
    { PHASES, 5, { batch_size = 5, peak_memory_bytes = 11000, fits = true, extrapolated = false } },
    { PHASES, 6, { batch_size = 6, peak_memory_bytes = 13000, fits = false, extrapolated = false } },
  }
  for i, case in ipairs(expected) do
    eq(case[3], (models.predict(case[1], case[2])), ('case %d, batch size %d'):format(i, case[2]))
  end
  eq(nil, (models.predict(nil, 8)), 'no models')
end

return cases
