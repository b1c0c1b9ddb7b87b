#!/usr/bin/env node
// Formats the plugin's Lua with StyLua, using the repository's stylua.toml.
//
//   node scripts/stylua.mjs --check [--tools DIR]   list the files that would change; exit 1 if any
//   node scripts/stylua.mjs --write [--tools DIR]   rewrite them
//
// No stylua binary can be installed here (no crates.io, no GitHub downloads), but npm can install
// StyLua compiled to WebAssembly, a library with formatCode(code, config, range, verify):
//
//   npm install --prefix DIR @johnnymorganz/stylua@2.5.2
//
// DIR is --tools, else $SKYLINE_LUA_TOOLS, else .venv/lua-tools. The version is pinned because
// another StyLua may lay the same code out differently, and then the check would fail on code
// nobody changed.
//
// stylua.toml is read as a small subset of TOML: `key = value` lines (a "string", an integer, true
// or false), `# comments`, and `[section]` headers; StyLua's own configuration needs nothing more.
// An unknown key is an error, so that no setting is silently ignored.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const VERSION = '2.5.2';
const PACKAGE = '@johnnymorganz/stylua';
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
// The Lua of the plugin: lua/**/*.lua, plugin/*.lua, tests/*.lua.
const SOURCES = [
  ['lua', true],
  ['plugin', false],
  ['tests', false],
];

function fail(message, status = 2) {
  console.error(`stylua: ${message}`);
  process.exit(status);
}

function parseArgs(argv) {
  const args = { mode: null, tools: process.env.SKYLINE_LUA_TOOLS || path.join(ROOT, '.venv', 'lua-tools') };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--check' || arg === '--write') {
      args.mode = arg.slice(2);
    } else if (arg === '--tools' && i + 1 < argv.length) {
      args.tools = argv[++i];
    } else {
      fail(`unknown argument ${arg}; usage: node scripts/stylua.mjs --check|--write [--tools DIR]`);
    }
  }
  if (!args.mode) {
    fail('usage: node scripts/stylua.mjs --check|--write [--tools DIR]');
  }
  return args;
}

function loadStylua(tools) {
  const install = `npm install --prefix ${tools} ${PACKAGE}@${VERSION}`;
  const manifest = path.join(path.resolve(tools), 'node_modules', ...PACKAGE.split('/'), 'package.json');
  if (!fs.existsSync(manifest)) {
    fail(`${PACKAGE} is not installed in ${tools}; run: ${install}`);
  }
  const version = JSON.parse(fs.readFileSync(manifest, 'utf8')).version;
  if (version !== VERSION) {
    fail(`${tools} has ${PACKAGE} ${version}, not ${VERSION}; run: ${install}`);
  }
  return createRequire(manifest)(PACKAGE);
}

function parseValue(text, where) {
  const string = text.match(/^"([^"\\]*)"$/) || text.match(/^'([^']*)'$/);
  if (string) return string[1];
  if (/^-?\d+$/.test(text)) return Number(text);
  if (text === 'true' || text === 'false') return text === 'true';
  fail(`${where}: expected a "string", an integer, true or false, not ${text}`);
}

// {'column_width': 120, 'sort_requires.enabled': false, ...} from stylua.toml.
function readToml(file) {
  const settings = {};
  let section = '';
  fs.readFileSync(file, 'utf8')
    .split(/\r?\n/)
    .forEach((raw, index) => {
      const where = `${path.relative(ROOT, file)}:${index + 1}`;
      const line = raw.replace(/\s+#.*$/, '').trim();
      if (line === '' || line.startsWith('#')) return;
      const header = line.match(/^\[([A-Za-z_]+)\]$/);
      if (header) {
        section = header[1] + '.';
        return;
      }
      const pair = line.match(/^([A-Za-z_]+)\s*=\s*(.+)$/);
      if (!pair) fail(`${where}: expected key = value, not ${raw.trim()}`);
      settings[section + pair[1]] = parseValue(pair[2].trim(), where);
    });
  return settings;
}

function buildConfig(stylua, settings, file) {
  const enums = {
    line_endings: stylua.LineEndings,
    indent_type: stylua.IndentType,
    quote_style: stylua.QuoteStyle,
    call_parentheses: stylua.CallParenType,
    collapse_simple_statement: stylua.CollapseSimpleStatement,
    space_after_function_names: stylua.SpaceAfterFunctionNames,
    block_newline_gaps: stylua.BlockNewlineGaps,
    syntax: stylua.LuaVersion,
  };
  const numbers = ['column_width', 'indent_width'];
  const config = stylua.Config.new();
  for (const [key, value] of Object.entries(settings)) {
    if (key in enums) {
      const choices = Object.keys(enums[key]).filter((name) => isNaN(Number(name)));
      if (!choices.includes(value)) fail(`${file}: ${key} must be one of ${choices.join(', ')}, not ${value}`);
      config[key] = enums[key][value];
    } else if (numbers.includes(key)) {
      if (!Number.isInteger(value) || value < 1) fail(`${file}: ${key} must be a positive integer`);
      config[key] = value;
    } else if (key === 'sort_requires.enabled') {
      if (typeof value !== 'boolean') fail(`${file}: ${key} must be true or false`);
      config.sort_requires = stylua.SortRequiresConfig.new().set_enabled(value);
    } else {
      fail(`${file}: unknown setting ${key}`);
    }
  }
  return config;
}

function luaFiles() {
  const found = [];
  const walk = (dir, recursive) => {
    if (!fs.existsSync(dir)) return;
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory() && recursive) walk(full, true);
      else if (entry.isFile() && entry.name.endsWith('.lua')) found.push(full);
    }
  };
  for (const [dir, recursive] of SOURCES) walk(path.join(ROOT, dir), recursive);
  return found.sort();
}

const args = parseArgs(process.argv.slice(2));
const stylua = loadStylua(args.tools);
const tomlFile = path.join(ROOT, 'stylua.toml');
const settings = readToml(tomlFile);
buildConfig(stylua, settings, 'stylua.toml').free(); // a bad setting fails here, before any file
const changed = [];
let broken = false;
for (const file of luaFiles()) {
  const name = path.relative(ROOT, file);
  const code = fs.readFileSync(file, 'utf8');
  let formatted;
  try {
    // A fresh Config each time: formatCode takes ownership of the one it is given. Full
    // verification: the output is parsed again and must mean the same code.
    const config = buildConfig(stylua, settings, 'stylua.toml');
    formatted = stylua.formatCode(code, config, undefined, stylua.OutputVerification.Full);
  } catch (error) {
    console.error(`stylua: ${name}: ${error}`);
    broken = true;
    continue;
  }
  if (formatted !== code) {
    changed.push(name);
    if (args.mode === 'write') fs.writeFileSync(file, formatted);
  }
}
for (const name of changed) console.log(args.mode === 'write' ? `formatted ${name}` : name);
if (broken) process.exit(2);
if (args.mode === 'check' && changed.length > 0) {
  console.error(`stylua: ${changed.length} file(s) not formatted; run: node scripts/stylua.mjs --write`);
  process.exit(1);
}
