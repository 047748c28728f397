-- quotaengine's one server-side script (see redis.rs for the layout of every key).
-- Every call is atomic: Redis runs no other command while it runs.
--
-- ARGV: prefix, mode, owner, lock_ttl_ms, cursor, max_entries, need_leases,
--       write id (the writer's sequence number of a call that writes; '' for one
--       that does not), the store's epoch as the caller knows it ('' unknown; mode
--       'refill': the epoch to set when the store has none), known versions of the versioned tables (TABLES), [mode 'lease': the
--       number of accounts, then the accounts and tenants], then the writes (opcode +
--       fields).
-- mode: 'begin'  takes the write lock, then reads what changed;
--       'commit' applies the writes and drops the lock;
--       'append' applies the writes without taking the lock (fails while another
--                owner holds it), after reading what changed;
--       'lease'  as 'append', for admissions the caller decided on what it had read
--                up to its cursor: the writes are applied only if no other writer
--                has since touched the usage or leases of the given accounts
--                ('key SEP platform') or tenants ('RS name', the name escaped as in
--                the entries) nor any versioned table; else status 'conflict' and
--                nothing is written (the caller takes in what changed and decides
--                again);
--       'replay' as 'append', for the writes of a call whose reply was lost, sent
--                again under the same write id; also drops the lock if we own it;
--       'read'   only reads what changed;
--       'unlock' drops the lock if we own it;
--       'refill' writes back what an engine knew of a store that lost its data (SPEC
--                24.4): sets P:epoch when absent, adds the small tables' items that
--                are absent ('N' writes), then the engine's own usage and leases;
--                its first write argument is the lost epoch; its usage entries name
--                as their writer '~epoch:id:owner' (the id the row had before the
--                loss, and the engine that wrote it), so that an engine that had read
--                that row, or wrote it, skips it.
-- The store's epoch (P:epoch, a random id set when the store is first opened) tells
-- a store that lost its data (a restart without persistence, FLUSHALL, an empty
-- server in its place): every mode but 'unlock' and 'refill' of a caller that knows
-- an epoch answers {'lost', epoch or ''} when P:epoch differs, and does nothing.
-- A call that writes is applied at most once (SPEC 19.2): the writes of a call whose
-- id is not above the writer's last applied one (P:applied:<owner>, kept a day after
-- the writer's last write) are skipped; what changed is read as usual.
-- Reply: {status, head, more, entries, versions, tables, leases, results} (a usage
--        write's result is its entry's id), or {'busy', pttl} when another owner
--        holds the lock, {'lost', epoch} (above); in mode 'refill' {'ok', head, 0, {},
--        {}, {}, epoch, results}.
local P = ARGV[1]
local mode = ARGV[2]
local owner = ARGV[3]
local ttl = tonumber(ARGV[4])
local cursor = ARGV[5]
local max_entries = tonumber(ARGV[6])
local need_leases = ARGV[7] == '1'
local write_id = ARGV[8]
local epoch = ARGV[9]
-- The last one, the observed quota, conflicts with no decision ('headroom' may read
-- it up to 5 s old, SPEC 8.2).
local TABLES = {'cooldowns', 'keys', 'models', 'caps', 'history', 'calendars', 'priorities', 'prices',
  'platform_limits', 'tenant_limits', 'quota'}
local DECIDING_TABLES = #TABLES - 1
local known = {}
for i = 1, #TABLES do known[i] = ARGV[9 + i] end
local first_write = 10 + #TABLES
local accounts = {}
if mode == 'lease' then
  local n = tonumber(ARGV[first_write])
  for i = first_write + 1, first_write + n do accounts[ARGV[i]] = true end
  first_write = first_write + 1 + n
end
-- Entries name their writer; a refill's name the epoch whose data they bring back
-- ('~' and the lost epoch), so that the engines that held that data skip them.
local writer = owner
if mode == 'refill' then
  writer = '~' .. ARGV[first_write]
  first_write = first_write + 1
end
local APPLIED_TTL_MS = 86400000
local SEP = '\31'
-- Before each tenant (SPEC 23.2) at the end of a usage entry's kind field and of a
-- lease's amounts field; a watched tenant is RS and its name.
local RS = '\30'
local watch_tenants = false
for a, _ in pairs(accounts) do
  if string.sub(a, 1, 1) == RS then watch_tenants = true end
end

local LOG, LOCK, LASTMS, VER = P .. ':log', P .. ':lock', P .. ':lastms', P .. ':ver'
-- Usage entries whose id is later than their time (id -> time), for the sweep.
local LATE = P .. ':late'
local APPLIED = P .. ':applied:' .. owner

-- True when this call's writes were applied before (its reply was lost).
local function already_applied()
  if write_id == '' then return false end
  local last = redis.call('GET', APPLIED)
  return last ~= false and tonumber(last) >= tonumber(write_id)
end

local holder = redis.call('GET', LOCK)
if mode == 'unlock' then
  if holder == owner then redis.call('DEL', LOCK) end
  return {'ok'}
end
-- SPEC 24.4: the store lost what the caller saw in it; nothing is read or written.
local EPOCH = P .. ':epoch'
local stored_epoch = redis.call('GET', EPOCH)
if mode ~= 'refill' and epoch ~= '' and stored_epoch ~= epoch then
  return {'lost', stored_epoch or ''}
end
if holder and holder ~= owner then
  return {'busy', redis.call('PTTL', LOCK)}
end

local bumped = {}
local function bump(t)
  if not bumped[t] then
    -- A counter that starts (again: P:ver lost or deleted) starts from the server's
    -- time in µs, never at a value an engine may have cached (SPEC 24.4).
    if redis.call('HINCRBY', VER, t, 1) == 1 then
      local now = redis.call('TIME')
      redis.call('HSET', VER, t, now[1] .. string.format('%06d', tonumber(now[2])))
    end
    bumped[t] = true
  end
end

-- Stream ids follow the writers' clocks (never below an entry's own time), so that
-- a range read from a time finds every entry stamped at or after it.
-- The newest id's time is read once per call and stored once, after the writes.
local lastms = nil
local function xadd(ms, data, by)
  if lastms == nil then lastms = tonumber(redis.call('GET', LASTMS) or '0') end
  ms = tonumber(ms)
  -- A stream id's time is a u64 and Lua's numbers are doubles: times outside
  -- 0..2^53 - 1 ms (a clock set to the end of time) are clamped to stay an id.
  if ms < 0 then ms = 0 elseif ms > 9007199254740991 then ms = 9007199254740991 end
  if ms < lastms then ms = lastms end
  lastms = ms
  -- Entries carry their writer, who skips them when reading.
  return redis.call('XADD', LOG, string.format('%d', ms) .. '-*', 'd', (by or writer) .. SEP .. data)
end
local function save_lastms()
  if lastms ~= nil then redis.call('SET', LASTMS, string.format('%d', lastms)) end
end

local function field(s, n)
  local i = 1
  for part in string.gmatch(s .. SEP, '([^' .. SEP .. ']*)' .. SEP) do
    if i == n then return part end
    i = i + 1
  end
  return nil
end

local function read_changes()
  local entries = {}
  local more = 0
  local head = cursor
  local rows = redis.call('XRANGE', LOG, '(' .. cursor, '+', 'COUNT', max_entries)
  for i, e in ipairs(rows) do
    entries[i] = e[2][2]
    head = e[1]
  end
  if #rows >= max_entries then more = 1 end
  if #rows == 0 then
    -- Nothing after the cursor: follow on from the newest entry (the cursor may
    -- predate a trim).
    local last = redis.call('XREVRANGE', LOG, '+', '-', 'COUNT', 1)
    if last[1] then head = last[1][1] end
  end
  local versions = redis.call('HMGET', VER, unpack(TABLES))
  local tables = {}
  for i, t in ipairs(TABLES) do
    local v = versions[i] or '0'
    versions[i] = v
    if v ~= known[i] then
      tables[i] = redis.call('HGETALL', P .. ':' .. t)
    else
      tables[i] = false
    end
  end
  local leases = false
  if need_leases then leases = redis.call('HGETALL', P .. ':leases') end
  return head, more, entries, versions, tables, leases
end

local function delete_matching(key, keep, table_name)
  local all = redis.call('HGETALL', key)
  local n = 0
  for i = 1, #all, 2 do
    if not keep(all[i], all[i + 1]) then
      redis.call('HDEL', key, all[i])
      n = n + 1
    end
  end
  if n > 0 and table_name then bump(table_name) end
  return n
end

local function xdel_all(ids)
  local n = 0
  for j = 1, #ids, 1000 do
    n = n + redis.call('XDEL', LOG, unpack(ids, j, math.min(j + 999, #ids)))
  end
  return n
end

local function zrem_all(ids)
  for j = 1, #ids, 1000 do
    redis.call('ZREM', LATE, unpack(ids, j, math.min(j + 999, #ids)))
  end
end

-- A usage entry's time and route ('owner U key kind amount created platform model').
local U_ROUTE = '^[^' .. SEP .. ']*' .. SEP .. 'U' .. SEP .. string.rep('[^' .. SEP .. ']*' .. SEP, 3)
  .. '([^' .. SEP .. ']*)' .. SEP .. '(.*)$'
-- Where each class of the sweep goes on from: 's<class>' a feed id, 'z<class>' a time
-- in LATE, for the kept set 'set' (class '' is every model not kept).
local SWEEP = P .. ':sweep'

-- A usage entry's kind field, which ends with its tenants (SPEC 23.2): RS and each name.
local U_KIND = '^[^' .. SEP .. ']*' .. SEP .. 'U' .. SEP .. '[^' .. SEP .. ']*' .. SEP .. '([^' .. SEP .. ']*)'

-- Retention of usage (SPEC 10, 14.2, 24.3): the entries of a kept model (route -> its
-- cut-off) or carrying a kept tenant (RS and its name -> its cut-off) go at the
-- earliest cut-off of those, every other entry at `before`. Everything before the
-- lowest cut-off is trimmed; between it and the others, each class is scanned on from
-- where its last sweep stopped, at most `budget` entries in all. Returns the entries
-- deleted, or 'more' when the budget ran out first (the engine sweeps again soon).
local function sweep_usage(before, kept, names, budget)
  local lowest = before
  local tenants_kept = false
  for _, name in ipairs(names) do
    lowest = math.min(lowest, kept[name])
    if string.sub(name, 1, 1) == RS then tenants_kept = true end
  end
  local low = string.format('%d', lowest)
  local r = redis.call('XTRIM', LOG, 'MINID', low)
  -- Usage rows written after a step back of the clock (SPEC 10), by their time.
  local late = redis.call('ZRANGE', LATE, '-inf', '(' .. low, 'BYSCORE', 'LIMIT', 0, budget)
  r = r + xdel_all(late)
  zrem_all(late)
  budget = budget - #late
  if #names == 0 then
    redis.call('DEL', SWEEP)
    if budget <= 0 then return 'more' end
    return r
  end
  table.sort(names)
  local set = table.concat(names, '\30')
  if redis.call('HGET', SWEEP, 'set') ~= set then
    redis.call('DEL', SWEEP)
    redis.call('HSET', SWEEP, 'set', set)
  end
  -- The cut-off of what keeps an entry longest: its model's, or a tenant's it carries.
  local function kept_from(body, route)
    local from = route and kept[route]
    if tenants_kept and string.find(body, RS, 1, true) then
      local f = string.match(body, U_KIND)
      for t in string.gmatch(f or '', RS .. '([^' .. RS .. ']*)') do
        local c = kept[RS .. t]
        if c and (from == nil or c < from) then from = c end
      end
    end
    return from
  end
  local function carries(body, class)
    if not string.find(body, RS, 1, true) then return false end
    local f = string.match(body, U_KIND)
    for t in string.gmatch(f or '', RS .. '([^' .. RS .. ']*)') do
      if RS .. t == class then return true end
    end
    return false
  end
  local function due(body, class, cut)
    local created, route = string.match(body, U_ROUTE)
    if class == '' then
      if route and kept[route] then return false end
      if created == nil then return true end
    elseif string.sub(class, 1, 1) == RS then
      if created == nil or not carries(body, class) then return false end
    elseif route ~= class then
      return false
    end
    created = tonumber(created)
    if created >= cut then return false end
    -- No class deletes what another keeps longer: that one deletes it in its turn.
    local from = kept_from(body, route)
    return from == nil or created < from
  end
  local classes = {}
  for _, name in ipairs(names) do classes[#classes + 1] = {name, kept[name]} end
  classes[#classes + 1] = {'', before}
  local more = budget <= 0
  for _, c in ipairs(classes) do
    local class, cut = c[1], c[2]
    if cut > lowest and budget > 0 then
      -- The feed by id (an entry's id is never before its time).
      local from = redis.call('HGET', SWEEP, 's' .. class) or '-'
      local rows = redis.call('XRANGE', LOG, from, string.format('%d', cut - 1), 'COUNT', budget)
      local ids = {}
      for _, e in ipairs(rows) do
        if due(e[2][2], class, cut) then ids[#ids + 1] = e[1] end
      end
      r = r + xdel_all(ids)
      budget = budget - #rows
      if budget <= 0 then
        more = true
        redis.call('HSET', SWEEP, 's' .. class, '(' .. rows[#rows][1])
      else
        redis.call('HSET', SWEEP, 's' .. class, string.format('%d', cut))
      end
    end
    if cut > lowest and budget > 0 then
      -- Late entries by their time.
      local from = redis.call('HGET', SWEEP, 'z' .. class) or '-inf'
      local got = redis.call('ZRANGE', LATE, from, '(' .. string.format('%d', cut), 'BYSCORE', 'LIMIT', 0,
        budget, 'WITHSCORES')
      local ids, gone = {}, {}
      for j = 1, #got, 2 do
        local e = redis.call('XRANGE', LOG, got[j], got[j])
        if not e[1] then
          gone[#gone + 1] = got[j]
        elseif due(e[1][2][2], class, cut) then
          ids[#ids + 1] = got[j]
          gone[#gone + 1] = got[j]
        end
      end
      r = r + xdel_all(ids)
      zrem_all(gone)
      budget = budget - #got / 2
      if budget <= 0 then
        more = true
        redis.call('HSET', SWEEP, 'z' .. class, got[#got])
      else
        redis.call('HSET', SWEEP, 'z' .. class, string.format('%d', cut))
      end
    elseif cut > lowest then
      more = true
    end
  end
  if more then return 'more' end
  return r
end

-- SPEC 24.3: a late entry stamped before where a class's sweep of LATE goes on from
-- (a sweep by a clock ahead of the writer's) would never be come back for: each such
-- class goes on from its time instead.
local function sweep_late_from(t)
  local all = redis.call('HGETALL', SWEEP)
  for j = 1, #all, 2 do
    if string.sub(all[j], 1, 1) == 'z' and tonumber(all[j + 1]) > t then
      redis.call('HSET', SWEEP, all[j], string.format('%d', t))
    end
  end
end

local function apply_writes()
  local results = {}
  local i = first_write
  while i <= #ARGV do
    local op = ARGV[i]
    local r = 0
    if op == 'U' or op == 'RU' then -- created_ms, entry; 'RU' (mode 'refill'): created_ms,
      -- the row's id before the loss ('' unknown), entry: written by '~epoch:id:owner'
      local by, n = nil, 1
      if op == 'RU' then
        by, n = writer .. ':' .. ARGV[i + 2] .. ':' .. owner, 2
      end
      local id = xadd(ARGV[i + 1], ARGV[i + n + 1], by)
      -- Written after the clock stepped back: its id is later than its time, so
      -- trimming by id would keep it past the retention. The sweep deletes it by time.
      if lastms > tonumber(ARGV[i + 1]) then
        redis.call('ZADD', LATE, ARGV[i + 1], id)
        sweep_late_from(tonumber(ARGV[i + 1]))
      end
      -- Its id: what a refill names it by (SPEC 24.4).
      r = id
      i = i + n + 2
    elseif op == 'L' then -- id, created_ms, value
      redis.call('HSET', P .. ':leases', ARGV[i + 1], ARGV[i + 3])
      xadd(ARGV[i + 2], 'L' .. SEP .. ARGV[i + 1] .. SEP .. ARGV[i + 3])
      r = 1
      i = i + 4
    elseif op == 'D' then -- id
      r = redis.call('HDEL', P .. ':leases', ARGV[i + 1])
      if r > 0 then xadd(0, 'D' .. SEP .. ARGV[i + 1]) end
      i = i + 2
    elseif op == 'HSET' then -- table, field, value
      redis.call('HSET', P .. ':' .. ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
      bump(ARGV[i + 1])
      i = i + 4
    elseif op == 'HDEL' then -- table, field
      r = redis.call('HDEL', P .. ':' .. ARGV[i + 1], ARGV[i + 2])
      if r > 0 then bump(ARGV[i + 1]) end
      i = i + 3
    elseif op == 'CK' then -- key_id: cooldowns of one key (fields start with it)
      local prefix = ARGV[i + 1] .. SEP
      r = delete_matching(P .. ':cooldowns', function(f, _)
        return string.sub(f, 1, #prefix) ~= prefix
      end, 'cooldowns')
      i = i + 2
    elseif op == 'CE' then -- now: expired cooldowns (value starts with expires_at)
      local now = tonumber(ARGV[i + 1])
      r = delete_matching(P .. ':cooldowns', function(_, v)
        return tonumber(field(v, 1)) > now
      end, 'cooldowns')
      i = i + 2
    elseif op == 'H' then -- value
      local id = redis.call('INCR', P .. ':history_id')
      redis.call('HSET', P .. ':history', id, ARGV[i + 1])
      bump('history')
      i = i + 2
    elseif op == 'HD' then -- key_id, route ('' = any), kinds (',k1,k2,')
      local key, route, kinds = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
      r = delete_matching(P .. ':history', function(_, v)
        -- value: key, kind[:value], hit_at, route...
        if field(v, 1) ~= key then return true end
        local kind = string.match(field(v, 2), '^[^:]*')
        if not string.find(kinds, ',' .. kind .. ',', 1, true) then return true end
        if route ~= '' then
          local rest = string.sub(v, #field(v, 1) + #field(v, 2) + #field(v, 3) + 4)
          if rest ~= route then return true end
        end
        return false
      end, 'history')
      i = i + 4
    elseif op == 'S' then -- usage_before, leases_expired_before, history_before, n,
      -- n x (route, before): the kept models (SPEC 14.2), then the budget (entries)
      local before, leases_at, hist = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
      local n = tonumber(ARGV[i + 4])
      local kept, names = {}, {}
      for j = 1, n do
        names[j] = ARGV[i + 3 + 2 * j]
        kept[names[j]] = tonumber(ARGV[i + 4 + 2 * j])
      end
      r = sweep_usage(before, kept, names, tonumber(ARGV[i + 5 + 2 * n]))
      local all = redis.call('HGETALL', P .. ':leases')
      for j = 1, #all, 2 do
        if tonumber(field(all[j + 1], 2)) < leases_at then
          redis.call('HDEL', P .. ':leases', all[j])
          xadd(0, 'D' .. SEP .. all[j])
        end
      end
      -- SPEC 24.2: a learned concurrency cap's rows (kind:value) are never swept
      delete_matching(P .. ':history', function(_, v)
        return tonumber(field(v, 3)) >= hist or string.match(field(v, 2), '^[^:]*') == 'concurrency'
      end, 'history')
      i = i + 6 + 2 * n
    elseif op == 'N' then -- table, field, value: an item written back (mode 'refill')
      local t, f = ARGV[i + 1], ARGV[i + 2]
      r = redis.call('HSETNX', P .. ':' .. t, f, ARGV[i + 3])
      if r == 1 then bump(t) end
      -- History ids are taken from a counter the loss reset: it goes on past them.
      local n = tonumber(f)
      if t == 'history' and n and n > tonumber(redis.call('GET', P .. ':history_id') or '0') then
        redis.call('SET', P .. ':history_id', string.format('%d', n))
      end
      i = i + 4
    elseif op == 'G' then -- log value
      r = redis.call('INCR', P .. ':log_id')
      redis.call('XADD', P .. ':logs', 'MAXLEN', '~', 10000, '*', 'd', r .. SEP .. ARGV[i + 1])
      i = i + 2
    else
      save_lastms()
      return redis.error_reply('quotaengine: unknown write ' .. tostring(op))
    end
    results[#results + 1] = r
  end
  save_lastms()
  if write_id ~= '' then redis.call('SET', APPLIED, write_id, 'PX', APPLIED_TTL_MS) end
  return results
end

-- A feed entry ('owner SEP body') touching one of `accounts`: usage rows
-- ('U key kind tokens created platform model') and lease inserts ('L id key expires
-- tokens created platform model'). Lease deletes only free capacity.
local U_ACCOUNT = '^[^' .. SEP .. ']*' .. SEP .. 'U' .. SEP .. '([^' .. SEP .. ']*)' .. SEP
  .. string.rep('[^' .. SEP .. ']*' .. SEP, 3) .. '([^' .. SEP .. ']*)'
local L_ACCOUNT = '^[^' .. SEP .. ']*' .. SEP .. 'L' .. SEP .. '[^' .. SEP .. ']*' .. SEP .. '([^' .. SEP .. ']*)'
  .. SEP .. string.rep('[^' .. SEP .. ']*' .. SEP, 3) .. '([^' .. SEP .. ']*)'
-- The field that ends with an entry's tenants: a usage row's kind, a lease insert's
-- amounts.
local U_TENANTS = '^[^' .. SEP .. ']*' .. SEP .. 'U' .. SEP .. '[^' .. SEP .. ']*' .. SEP .. '([^' .. SEP .. ']*)'
local L_TENANTS = '^[^' .. SEP .. ']*' .. SEP .. 'L' .. SEP .. string.rep('[^' .. SEP .. ']*' .. SEP, 3)
  .. '([^' .. SEP .. ']*)'
local function names_watched_tenant(e)
  if not string.find(e, RS, 1, true) then return false end
  local f = string.match(e, U_TENANTS) or string.match(e, L_TENANTS)
  if not f then return false end
  for t in string.gmatch(f, RS .. '([^' .. RS .. ']*)') do
    if accounts[RS .. t] then return true end
  end
  return false
end
local function conflicts(more, entries, tables, leases)
  if more == 1 or leases then return true end
  for i = 1, DECIDING_TABLES do
    if tables[i] then return true end
  end
  for _, e in ipairs(entries) do
    if string.sub(e, 1, #owner + 1) ~= owner .. SEP then
      local key, platform = string.match(e, U_ACCOUNT)
      if not key then key, platform = string.match(e, L_ACCOUNT) end
      if key and accounts[key .. SEP .. platform] then return true end
      if watch_tenants and names_watched_tenant(e) then return true end
    end
  end
  return false
end

if mode == 'begin' or mode == 'read' then
  if mode == 'begin' then redis.call('SET', LOCK, owner, 'PX', ttl) end
  local head, more, entries, versions, tables, leases = read_changes()
  return {'ok', head, more, entries, versions, tables, leases, {}}
elseif mode == 'append' or mode == 'lease' or mode == 'replay' then
  local head, more, entries, versions, tables, leases = read_changes()
  local dup = already_applied()
  if mode == 'lease' and not dup and conflicts(more, entries, tables, leases) then
    return {'conflict', head, more, entries, versions, tables, leases, {}}
  end
  if mode == 'replay' and holder == owner then redis.call('DEL', LOCK) end
  -- Our own entries follow: the caller's cursor moves past them only when nothing
  -- more of others' remains to read.
  local results = {}
  if not dup then results = apply_writes() end
  if more == 0 then
    local last = redis.call('XREVRANGE', LOG, '+', '-', 'COUNT', 1)
    if last[1] then head = last[1][1] end
  end
  return {'ok', head, more, entries, versions, tables, leases, results}
elseif mode == 'commit' then
  local results = {}
  if not already_applied() then results = apply_writes() end
  redis.call('DEL', LOCK)
  local head = cursor
  local last = redis.call('XREVRANGE', LOG, '+', '-', 'COUNT', 1)
  if last[1] then head = last[1][1] end
  local versions = redis.call('HMGET', VER, unpack(TABLES))
  for i = 1, #TABLES do versions[i] = versions[i] or '0' end
  -- The tables our writes changed, whole: what the engine writes back should the
  -- store lose its data (SPEC 24.4; the engine's mirror takes nothing from them).
  local own = {}
  for i = 1, #TABLES do
    if bumped[TABLES[i]] then own[i] = redis.call('HGETALL', P .. ':' .. TABLES[i]) else own[i] = false end
  end
  return {'ok', head, 0, {}, versions, own, false, results}
elseif mode == 'refill' then
  -- The first engine to refill sets the new epoch; the others find it and add only
  -- what is absent (items) or their own (usage, leases: each engine sends its own).
  if not stored_epoch then
    stored_epoch = epoch
    redis.call('SET', EPOCH, epoch)
  end
  -- Once per engine and lost epoch (a refill whose reply was lost is sent again).
  local lost = string.sub(writer, 2)
  local results = {}
  if redis.call('HGET', P .. ':refilled', owner) ~= lost then
    redis.call('HSET', P .. ':refilled', owner, lost)
    results = apply_writes()
  end
  local head = '0-0'
  local last = redis.call('XREVRANGE', LOG, '+', '-', 'COUNT', 1)
  if last[1] then head = last[1][1] end
  -- The shape of every 'ok' reply (8 parts); the epoch in the leases' place.
  return {'ok', head, 0, {}, {}, {}, stored_epoch, results}
end
return redis.error_reply('quotaengine: unknown mode ' .. tostring(mode))
