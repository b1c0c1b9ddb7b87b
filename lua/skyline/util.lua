-- Small helpers shared by the modules: messages and trailing-edge debouncing.
local M = {}

--- A message prefixed with the plugin's name; `level` defaults to INFO. Shown from the main
--- loop: inside an RPC request (the remote plugin delivering an event, any API client) an
--- error message would otherwise become that request's error instead of reaching the user.
function M.notify(message, level)
  vim.schedule(function()
    vim.notify('skyline: ' .. message, level or vim.log.levels.INFO)
  end)
end

function M.error(message)
  M.notify(message, vim.log.levels.ERROR)
end

function M.warn(message)
  M.notify(message, vim.log.levels.WARN)
end

--- A function that runs `fn` once calls to it have stopped for `delay_ms` (a `vim.uv` timer),
--- with the arguments of the last call; `cancel()` on the result drops a pending run.
function M.debounce(fn)
  local timer
  local debounced = {}
  function debounced.cancel()
    if timer then
      timer:stop()
      timer:close()
      timer = nil
    end
  end
  function debounced.call(delay_ms, ...)
    debounced.cancel()
    local args = { n = select('#', ...), ... }
    local this = vim.uv.new_timer()
    timer = this
    this:start(delay_ms, 0, function()
      vim.schedule(function()
        if timer ~= this then
          return -- superseded between firing and this scheduled run
        end
        debounced.cancel()
        fn(unpack(args, 1, args.n))
      end)
    end)
  end
  return debounced
end

return M
