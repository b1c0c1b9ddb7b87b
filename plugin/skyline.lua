-- skyline.nvim: entry points only (commands, <Plug> maps). Every callback loads its module
-- when first used, so starting Neovim costs nothing.
if vim.g.loaded_skyline == 1 then
  return
end
vim.g.loaded_skyline = 1

if vim.fn.has('nvim-0.11') ~= 1 then
  vim.notify_once('skyline.nvim needs Neovim 0.11 or newer', vim.log.levels.WARN)
  return
end

local function command(name, method, opts)
  vim.api.nvim_create_user_command(name, function(args)
    require('skyline.commands')[method](args)
  end, opts)
end

local function completion(method)
  return function(...)
    return require('skyline.commands')[method](...)
  end
end

command('SkylineProfile', 'profile', {
  nargs = '*',
  count = 0,
  complete = completion('complete_entry'),
  desc = 'skyline: profile a training script or an entry point (default: this buffer); script arguments after --',
})
command('SkylineStop', 'stop', { nargs = 0, desc = 'skyline: stop the running profile' })
command('SkylineBreakdown', 'breakdown', { nargs = 0, desc = 'skyline: toggle the breakdown float' })
command('SkylineBatchSize', 'batch_size', {
  nargs = 1,
  bang = true,
  complete = completion('complete_batch_size'),
  desc = 'skyline: set the batch size (N, +N, -N or max)',
})
command('SkylineConnect', 'connect', {
  nargs = '+',
  complete = completion('complete_connect'),
  desc = 'skyline: use the engine at HOST:PORT (or local)',
})
command('SkylineClear', 'clear', { nargs = 0, desc = 'skyline: remove all results' })
command('SkylineToggle', 'toggle', { nargs = 0, desc = "skyline: hide or show this buffer's costs" })

-- Expression maps that become an operator, so that `.` repeats a batch-size change.
vim.keymap.set('n', '<Plug>(skyline-batch-inc)', function()
  return require('skyline.batch').repeatable(1)
end, { expr = true, desc = 'skyline: larger batch size' })
vim.keymap.set('n', '<Plug>(skyline-batch-dec)', function()
  return require('skyline.batch').repeatable(-1)
end, { expr = true, desc = 'skyline: smaller batch size' })
vim.keymap.set('n', '<Plug>(skyline-profile)', '<Cmd>SkylineProfile<CR>', { desc = 'skyline: profile' })

-- The batch-size keys from the start in a buffer that can be profiled (an entry point, a training
-- script): before any result they say so, where they fell through to `+` and moved the cursor.
vim.api.nvim_create_autocmd('FileType', {
  pattern = 'python',
  group = vim.api.nvim_create_augroup('skyline_batch_keys', { clear = true }),
  callback = function(args)
    require('skyline.batch').map_if_profilable(args.buf)
  end,
})
vim.keymap.set('n', '<Plug>(skyline-breakdown)', '<Cmd>SkylineBreakdown<CR>', {
  desc = 'skyline: toggle the breakdown',
})
