-- Values the editor shares with the engine, kept by hand in both languages; tests/test_parity.py
-- fails when they drift apart. Python: skyline_engine.entry.contract (PROVIDERS,
-- BATCH_SIZE_PARAMETER), skyline_engine.service.params (MAX_BATCH_SIZE),
-- skyline_engine.service.tokens (default_token_path), skyline_engine.predict.batch_models
-- (POOR_FIT_R2, CLOSE_FIT_RESIDUAL, MAX_SPREAD), skyline_engine.vocabulary (the phases, the kinds of tensors and
-- how both read).
local M = {}

M.MODEL_PROVIDER = 'skyline_model_provider'
M.INPUT_PROVIDER = 'skyline_input_provider'
M.ITERATION_PROVIDER = 'skyline_iteration_provider'
M.PROVIDERS = { M.MODEL_PROVIDER, M.INPUT_PROVIDER, M.ITERATION_PROVIDER }

-- The input provider's parameter whose default is the batch size (the literal the keys rewrite).
M.BATCH_SIZE_PARAMETER = 'batch_size'

-- The largest batch size the engine accepts in a request.
M.MAX_BATCH_SIZE = 2147483647

-- Below this R² the run-time line predicts no time (a line through noise predicts noise), unless it
-- misses no measured time by more than CLOSE_FIT_RESIDUAL (a time that barely grows scores a low R²).
M.POOR_FIT_R2 = 0.95
M.CLOSE_FIT_RESIDUAL = 0.01
-- A check past the timed batch sizes whose blocks spread more than this share of their mean (IQR)
-- does not correct the predictions there.
M.MAX_SPREAD = 0.25

-- The document's names for the parts of an iteration, and how they read (skyline_engine/vocabulary.py).
M.FORWARD_BACKWARD = 'forward_backward'
M.OPTIMIZER = 'optimizer'
M.OTHER = 'other'
M.FORWARD = 'forward'
M.BACKWARD = 'backward'
M.PEAK_PHASE_LABELS = {
  [M.FORWARD_BACKWARD] = 'the forward and backward pass',
  [M.OPTIMIZER] = 'the optimizer step',
  [M.OTHER] = 'outside forward, backward and the step (zero_grad, your own code)',
}
-- The forward_backward phase of an iteration without backward work (inference, evaluation).
M.FORWARD_ONLY_LABEL = 'the forward pass'
M.TENSOR_KIND_LABELS = {
  [M.FORWARD] = 'of forward outputs',
  [M.BACKWARD] = 'made in backward',
  [M.OPTIMIZER] = 'made in the step',
}

-- The other tensors alive at the memory peak that the float names, as the terminal report does
-- (skyline_engine.render.terminal): those holding at least this share of the peak.
M.NOTABLE_OTHER_TENSOR = 0.05

--- Where `skyline serve --listen` writes its token unless told otherwise:
--- $XDG_STATE_HOME/skyline/token, else ~/.local/state/skyline/token.
function M.default_token_path()
  local state_home = os.getenv('XDG_STATE_HOME')
  if state_home == nil or state_home == '' then -- Python's `or` skips an empty value too
    state_home = vim.fs.joinpath(vim.uv.os_homedir(), '.local', 'state')
  end
  return vim.fs.joinpath(state_home, 'skyline', 'token')
end

return M
