//! The waiting room's Lua scripts. Each runs atomically on one slot: every
//! key carries the product's hash tag, the fixed ones arrive as KEYS (in the
//! order of `QueueKeys::all`) and the per-ticket ones (`entry:<ticket>`,
//! `pass:<ticket>`) are built from ARGV[1], the queue's key base, which
//! carries the same tag. Redis's `TIME` is the only clock: instances' clocks
//! differ, and a pass's deadline must mean the same to all of them.
//!
//! A pass is open while `issued` or `claimed`; it leaves that state exactly
//! once (`used` by SETTLE, `lapsed` by LAPSE_PASS), and only that step hands
//! its units back from `outstanding`, so no order or repeat of calls hands
//! back twice.
//!
//! Log events read `I|number|ticket|customer|issued_ms|expires_ms` and
//! `L|number|ticket|at_ms`.

/// Names for the KEYS and the helpers every script shares.
macro_rules! preamble {
    () => {
        r#"
local base = ARGV[1]
local K_META, K_BY_CUSTOMER, K_SEQ, K_PRE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_LINE, K_CURSOR, K_DEADLINES, K_OUTSTANDING = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_LOG, K_UNCONFIRMED, K_GATE_STOCK, K_MIRROR_STOCK = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local K_MIRROR_UNPAID, K_REBUILD, K_FORGET, K_DRAWING = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local function entry_key(t) return base .. 'entry:' .. t end
local function pass_key(t) return base .. 'pass:' .. t end
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
-- Every change to the pre-queue's set moves its version, so a draw written
-- in parts (DRAW_PART, DRAW) knows the set it shuffled is still the set.
-- `life` (when the queue was made or rebuilt) keeps two lives of a queue
-- from sharing a version.
local function pre_changed() redis.call('HINCRBY', K_META, 'pre_changes', 1) end
local function pre_version()
  local v = redis.call('HMGET', K_META, 'life', 'pre_changes')
  return (v[1] or '0') .. ':' .. (v[2] or '0')
end
-- The one place an open pass lapses: its units go back once.
local function lapse_pass(t, now)
  local pk = pass_key(t)
  local p = redis.call('HMGET', pk, 'n', 'units')
  redis.call('HSET', pk, 'state', 'lapsed', 'ended_ms', now)
  redis.call('ZREM', K_DEADLINES, t)
  redis.call('DECRBY', K_OUTSTANDING, tonumber(p[2]) or 0)
  redis.call('HINCRBY', K_META, 'lapsed', 1)
  redis.call('RPUSH', K_LOG, 'L|' .. p[1] .. '|' .. t .. '|' .. now)
end
-- The purchase under admission `admission` committed: the pass is used,
-- its units no longer outstanding (see SETTLE). Returns 1, or 0 when
-- another admission holds it or it lapsed.
local function settle_pass(t, number, admission)
  local p = redis.call('HMGET', pass_key(t), 'n', 'state', 'units', 'admission')
  if p[1] ~= number then return 0 end
  if p[2] == 'used' then
    if p[4] == admission then return 1 end
    return 0
  end
  if not (p[2] == 'issued' or (p[2] == 'claimed' and p[4] == admission)) then return 0 end
  local units = tonumber(p[3])
  redis.call('HSET', pass_key(t), 'state', 'used', 'admission', admission, 'ended_ms', now_ms())
  redis.call('ZREM', K_DEADLINES, t)
  redis.call('DECRBY', K_OUTSTANDING, units)
  redis.call('HINCRBY', K_META, 'used', 1)
  -- With the gate off the mirror is the bound: the units just sold leave
  -- it with the pass, or the next ISSUE would count them twice (once sold,
  -- once free). `settled_units` lets a mirror read from Postgres before
  -- this step take them off too (MIRROR_STOCK).
  redis.call('HINCRBY', K_META, 'settled_units', units)
  if redis.call('EXISTS', K_MIRROR_STOCK) == 1 then redis.call('DECRBY', K_MIRROR_STOCK, units) end
  return 1
end
-- Takes `customer`'s place `t` out: from the pre-queue, or from the line,
-- where the places behind close up (the cursor never passed an unconfirmed
-- place: ISSUE stops at one).
local function take_place(customer, t)
  redis.call('DEL', entry_key(t))
  if redis.call('HGET', K_BY_CUSTOMER, customer) == t then redis.call('HDEL', K_BY_CUSTOMER, customer) end
  redis.call('ZREM', K_UNCONFIRMED, t)
  if redis.call('ZREM', K_PRE, t) == 1 then pre_changed() end
  local position = redis.call('ZSCORE', K_LINE, t)
  if position then
    redis.call('ZREM', K_LINE, t)
    local behind = redis.call('ZRANGEBYSCORE', K_LINE, '(' .. position, '+inf')
    for _, other in ipairs(behind) do redis.call('ZINCRBY', K_LINE, -1, other) end
    redis.call('HINCRBY', K_META, 'tail', -1)
  end
end
-- Puts a late place where `(joined_ms, seq)` order has it among the late
-- places not yet admitted: those behind it move back one.
local function place_late(t, seq, joined)
  local cursor = tonumber(redis.call('GET', K_CURSOR)) or 1
  local tail = tonumber(redis.call('HGET', K_META, 'tail')) or 0
  local at = tail + 1
  while at > cursor do
    local before = redis.call('ZRANGEBYSCORE', K_LINE, at - 1, at - 1, 'LIMIT', 0, 1)[1]
    if not before then break end
    local b = redis.call('HMGET', entry_key(before), 'late', 'joined_ms', 'seq')
    local bj, bs = tonumber(b[2]) or 0, tonumber(b[3]) or 0
    if b[1] ~= '1' or bj < joined or (bj == joined and bs < seq) then break end
    at = at - 1
  end
  for p = tail, at, -1 do
    local moving = redis.call('ZRANGEBYSCORE', K_LINE, p, p, 'LIMIT', 0, 1)[1]
    if moving then redis.call('ZADD', K_LINE, p + 1, moving) end
  end
  redis.call('ZADD', K_LINE, at, t)
  redis.call('HSET', K_META, 'tail', tail + 1)
end
local function entry_of(t)
  local e = redis.call('HMGET', entry_key(t), 'customer', 'seq', 'joined_ms', 'late', 'confirmed')
  return {t, e[1] or '', tonumber(e[2]) or 0, tonumber(e[3]) or 0, tonumber(e[4]) or 0, tonumber(e[5]) or 0}
end
-- CONFIRM of the places in ARGV from `first` on, 5 values each (see
-- CONFIRM); `drawn` is `:meta`'s.
local function confirm_places(drawn, first)
  local out = {}
  local i = first
  while i + 4 <= #ARGV do
    local t, customer, seq, joined, late = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), ARGV[i + 4]
    i = i + 5
    -- The place is there when its customer's is it: a hash alone may be
    -- what a rebuilder that died part-way left.
    if redis.call('HGET', K_BY_CUSTOMER, customer) == t then
      redis.call('HSET', entry_key(t), 'confirmed', 1)
      redis.call('ZREM', K_UNCONFIRMED, t)
      table.insert(out, 1)
    elseif late == '0' and drawn == '1' then
      -- Kept until the row is deleted (`services::queue::entries`).
      redis.call('SADD', K_FORGET, t)
      table.insert(out, 0)
    else
      local other = redis.call('HGET', K_BY_CUSTOMER, customer)
      local blocked = false
      if other then
        local o = redis.call('HGET', entry_key(other), 'confirmed')
        if o == '0' and redis.call('EXISTS', pass_key(other)) == 0 then
          take_place(customer, other)
        else
          blocked = true
        end
      end
      if blocked then
        table.insert(out, 3)
      else
      redis.call('HSET', entry_key(t), 'customer', customer, 'seq', seq, 'joined_ms', joined,
        'late', late, 'confirmed', 1, 'created_ms', joined)
      redis.call('HSET', K_BY_CUSTOMER, customer, t)
      if (tonumber(redis.call('GET', K_SEQ)) or 0) < seq then redis.call('SET', K_SEQ, seq) end
      if joined > (tonumber(redis.call('HGET', K_META, 'last_join_ms')) or 0) then
        redis.call('HSET', K_META, 'last_join_ms', joined)
      end
      if late == '0' then
        redis.call('ZADD', K_PRE, seq, t)
        pre_changed()
      else
        place_late(t, seq, joined)
      end
      table.insert(out, 2)
      end
    end
  end
  return out
end
"#
    };
}

macro_rules! script {
    ($body:literal) => {
        concat!(preamble!(), $body)
    };
}

/// ARGV: base, starts_at_ms, pass_ms, units, whether it may create ('1').
/// Creates the queue unless it exists (and only if it may: a caller that
/// saw it exists only gives it the setup, so a queue freed or dropped
/// meanwhile is not made again empty); an undrawn one takes the new setup.
/// Returns 1 if created.
pub(super) const PREPARE: &str = script!(
    r#"
local state = redis.call('HGET', K_META, 'state')
if not state and ARGV[5] ~= '1' then return 0 end
if not state then
  -- A rebuild part-way: the queue is not new, and the rebuild makes it.
  if redis.call('EXISTS', K_REBUILD) == 1 then return 0 end
  redis.call('HSET', K_META, 'starts_at_ms', ARGV[2], 'pass_ms', ARGV[3], 'units', ARGV[4],
    'state', 'pre', 'drawn', 0, 'last_join_ms', 0, 'tail', 0, 'admissions', 0, 'used', 0, 'lapsed', 0,
    'life', now_ms())
  redis.call('SET', K_CURSOR, 1)
  redis.call('SET', K_OUTSTANDING, 0)
  -- A new life: a retirement part-way frees nothing of it (RETIRE).
  redis.call('UNLINK', base .. 'retiring')
  return 1
end
if redis.call('HGET', K_META, 'drawn') == '0' then
  redis.call('HSET', K_META, 'starts_at_ms', ARGV[2], 'pass_ms', ARGV[3], 'units', ARGV[4])
end
return 0
"#
);

/// ARGV: base, customer, fresh ticket.
/// Returns {code, state, ticket, customer, seq, joined_ms, late, confirmed}:
/// 0 new, 1 again, 2 refused (state), 3 missing, 4 the fresh ticket is taken.
/// `joined_ms` never goes back (so `(joined_at, seq)` order is `seq` order),
/// and after the draw it is at least the start, so `late` stays checkable.
pub(super) const JOIN: &str = script!(
    r#"
local customer, fresh = ARGV[2], ARGV[3]
local meta = redis.call('HMGET', K_META, 'state', 'drawn', 'starts_at_ms', 'last_join_ms')
local state = meta[1]
if not state then return {3, '', '', '', 0, 0, 0, 0} end
local existing = redis.call('HGET', K_BY_CUSTOMER, customer)
if existing then
  local e = entry_of(existing)
  return {1, state, e[1], e[2], e[3], e[4], e[5], e[6]}
end
if state == 'sold_out' or state == 'closed' then return {2, state, '', '', 0, 0, 0, 0} end
if redis.call('EXISTS', entry_key(fresh)) == 1 then return {4, state, '', '', 0, 0, 0, 0} end
local now = now_ms()
local joined = math.max(now, tonumber(meta[4]) or 0)
local starts = tonumber(meta[3])
if meta[2] == '1' and joined < starts then joined = starts end
local late = 0
if joined >= starts then late = 1 end
local seq = redis.call('INCR', K_SEQ)
redis.call('HSET', entry_key(fresh), 'customer', customer, 'seq', seq, 'joined_ms', joined,
  'late', late, 'confirmed', 0, 'created_ms', now)
redis.call('HSET', K_BY_CUSTOMER, customer, fresh)
redis.call('HSET', K_META, 'last_join_ms', joined)
redis.call('ZADD', K_UNCONFIRMED, now, fresh)
if late == 1 then
  local tail = redis.call('HINCRBY', K_META, 'tail', 1)
  redis.call('ZADD', K_LINE, tail, fresh)
else
  redis.call('ZADD', K_PRE, seq, fresh)
  pre_changed()
end
return {0, state, fresh, customer, seq, joined, late, 0}
"#
);

/// ARGV: base, then N × {ticket, customer, seq, joined_ms, late}: places
/// whose Postgres row is committed. Each is confirmed. One Redis does not
/// have (the queue was rebuilt from a snapshot older than the row's commit,
/// or a sweep racing its joiner took it back) is put back where the line
/// has it: in the pre-queue before the draw, among the late places by
/// `(joined_ms, seq)` after it; an unconfirmed place of the same customer
/// gives way (its row can never commit beside this one).
/// Returns a code per place: 1 confirmed, 2 put back, 0 too late (a
/// pre-queue place of a queue drawn without it), 3 refused (the customer
/// holds another place that is confirmed or admitted: Redis and Postgres
/// disagree, and nothing is moved), or {-1} for a missing queue.
pub(super) const CONFIRM: &str = script!(
    r#"
local drawn = redis.call('HGET', K_META, 'drawn')
if not drawn then return {-1} end
return confirm_places(drawn, 2)
"#
);

/// ARGV: base, life, from, then places as CONFIRM takes them, in arrival
/// order: the tick's check for joins Redis lost. Confirms them (putting
/// back those missing) and moves `checked_seq` to the last one's seq, in
/// one step, and only while the queue is the same `life` and its mark is
/// still `from` or past it: after a failover to a replica whose mark is
/// lower, a check read on the old primary confirms nothing there and moves
/// nothing (the replica's own check starts from its own mark). The mark
/// stops short of a refused place, so it is tried again. Returns CONFIRM's
/// codes, or {-2} when the mark or life moved.
pub(super) const CONFIRM_CHECKED: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'drawn', 'life', 'checked_seq')
if not meta[1] then return {-1} end
if (meta[2] or '') ~= ARGV[2] or (tonumber(meta[3]) or 0) < tonumber(ARGV[3]) then return {-2} end
local out = confirm_places(meta[1], 4)
local through = nil
for n, code in ipairs(out) do
  if code == 3 then break end
  through = tonumber(ARGV[4 + (n - 1) * 5 + 2])
end
if through and through > (tonumber(meta[3]) or 0) then
  redis.call('HSET', K_META, 'checked_seq', through)
end
return out
"#
);

/// ARGV: base, customer, ticket, by the sweep (1/0). Removes an
/// unconfirmed entry without a trace; places behind a late one close up, so
/// the line stays dense (the cursor never passed it: ISSUE stops at an
/// unconfirmed entry). Once the sweep has handed the entry out only the
/// sweep removes it. Returns 1 if removed.
pub(super) const UNDO_JOIN: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 0 then return 0 end
local customer, t = ARGV[2], ARGV[3]
local e = redis.call('HMGET', entry_key(t), 'customer', 'confirmed', 'swept')
if e[1] ~= customer or e[2] ~= '0' then return 0 end
if e[3] == '1' and ARGV[4] ~= '1' then return 0 end
take_place(customer, t)
return 1
"#
);

/// ARGV: base, age_ms. Unconfirmed entries made at least `age` ago, each
/// {ticket, customer, seq, joined_ms, late, confirmed}.
pub(super) const UNCONFIRMED: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 0 then return {} end
local cutoff = now_ms() - tonumber(ARGV[2])
local out = {}
for _, t in ipairs(redis.call('ZRANGEBYSCORE', K_UNCONFIRMED, '-inf', cutoff, 'LIMIT', 0, 1000)) do
  -- From now on the sweep settles it: a slow joiner's undo must not take
  -- it out while the sweep's insert may be committing.
  redis.call('HSET', entry_key(t), 'swept', 1)
  table.insert(out, entry_of(t))
end
return out
"#
);

/// ARGV: base, first rank. Returns {exists, drawn, unconfirmed, next rank
/// or -1, busy, then at most 1000 pre-queue tickets from that rank, in
/// arrival order}. Busy (1, and nothing read) when the first page is asked
/// for while another drawer's lease is live (see DRAW_PART): every
/// instance's tick draws at the opening second, and each would otherwise
/// page the whole pre-queue, and shuffle it, only to be told so.
pub(super) const PRE_QUEUE: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'drawn', 'drawer_until_ms')
local drawn = meta[1]
if not drawn then return {0, 0, 0, -1, 0} end
local first = tonumber(ARGV[2])
if first == 0 and drawn == '0' and now_ms() < (tonumber(meta[2]) or 0) then
  return {1, 0, redis.call('ZCARD', K_UNCONFIRMED), -1, 1}
end
local page = redis.call('ZRANGE', K_PRE, first, first + 999)
local next = -1
if #page == 1000 then next = first + 1000 end
local out = {1, tonumber(drawn), redis.call('ZCARD', K_UNCONFIRMED), next, 0}
for _, t in ipairs(page) do table.insert(out, t) end
return out
"#
);

// A draw is written in parts (DRAW_PART calls of a bounded size into
// `:drawing`, then DRAW), because one script over a crowd's pre-queue holds
// Redis, and every gate call and poll of the opening second behind it: at
// 100,000 places it ran over half a second, and outran the client's wait.
// One drawer stages at a time: the first part takes a lease (`drawer`, in
// `:meta`, renewed by every part), since every instance's tick draws at the
// opening second and drawers that each start the stage afresh would undo
// each other's parts for seconds. A drawer whose lease lapsed (it stalled
// or died) is refused from then on, and the next starts over. The first
// part also takes the pre-queue's version; every later part and the
// finish require it. Every staged ticket is in the pre-queue and staged
// once, and the finish finds as many in the pre-queue as staged, the last
// at n: with the set unchanged from the first part to the finish, the
// stage is the set.

/// ARGV: base, drawer token, lease_ms, the version the first part
/// answered ('' in the first), the first position, then that part of the
/// order's tickets. Stages them at their positions; the first part takes
/// the lease (unless another drawer's is live) and starts the stage
/// afresh. Each must be in the pre-queue, confirmed, and not staged at
/// another position. Returns {code, version}: 0 staged, 1 already drawn,
/// 2 changed, 3 missing, 4 another drawer holds the lease.
pub(super) const DRAW_PART: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'state', 'drawn', 'drawer', 'drawer_until_ms')
if not meta[1] then return {3, ''} end
if meta[2] == '1' then return {1, ''} end
local token, now = ARGV[2], now_ms()
local position = tonumber(ARGV[5])
if position == 1 then
  if meta[3] and meta[3] ~= token and now < (tonumber(meta[4]) or 0) then return {4, ''} end
  redis.call('DEL', K_DRAWING)
elseif meta[3] ~= token then
  return {4, ''}
end
redis.call('HSET', K_META, 'drawer', token, 'drawer_until_ms', now + tonumber(ARGV[3]))
local version = pre_version()
-- A drawer refused lets go of the lease: the next need not wait it out.
local function changed()
  redis.call('HDEL', K_META, 'drawer', 'drawer_until_ms')
  return {2, version}
end
if position > 1 and version ~= ARGV[4] then return changed() end
for i = 6, #ARGV do
  local t = ARGV[i]
  if not redis.call('ZSCORE', K_PRE, t) then return changed() end
  if redis.call('HGET', entry_key(t), 'confirmed') ~= '1' then return changed() end
  local staged = redis.call('ZSCORE', K_DRAWING, t)
  if staged and tonumber(staged) ~= position then return changed() end
  redis.call('ZADD', K_DRAWING, position, t)
  position = position + 1
end
return {0, version}
"#
);

/// ARGV: base, drawer token, the version DRAW_PART answered ('' for an
/// empty order), the order's length. Completes the draw this drawer staged
/// (an empty order stages nothing): the stage must hold exactly the
/// pre-queue, unchanged since the first part; late arrivals already in the
/// line move behind it, keeping their order. A paused or closed queue stays
/// so; a `pre` one opens. Returns 0 done, 1 already, 2 changed, 3 missing,
/// 4 another drawer holds the lease.
pub(super) const DRAW: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'state', 'drawn', 'drawer')
if not meta[1] then return 3 end
if meta[2] == '1' then return 1 end
local n = tonumber(ARGV[4])
if n ~= redis.call('ZCARD', K_PRE) then
  if meta[3] == ARGV[2] then redis.call('HDEL', K_META, 'drawer', 'drawer_until_ms') end
  return 2
end
if n > 0 then
  if meta[3] ~= ARGV[2] then return 4 end
  -- n tickets at distinct positions, the last at n: positions 1..n.
  if pre_version() ~= ARGV[3] or n ~= redis.call('ZCARD', K_DRAWING)
    or tonumber(redis.call('ZRANGE', K_DRAWING, -1, -1, 'WITHSCORES')[2]) ~= n then
    redis.call('HDEL', K_META, 'drawer', 'drawer_until_ms')
    return 2
  end
else
  redis.call('DEL', K_DRAWING)
end
local late = redis.call('ZRANGE', K_LINE, 0, -1)
for i, t in ipairs(late) do redis.call('ZADD', K_DRAWING, n + i, t) end
if redis.call('EXISTS', K_DRAWING) == 1 then
  redis.call('RENAME', K_DRAWING, K_LINE)
else
  redis.call('DEL', K_LINE)
end
redis.call('HSET', K_META, 'drawn', 1, 'tail', n + #late)
redis.call('HDEL', K_META, 'drawer', 'drawer_until_ms')
if meta[1] == 'pre' then redis.call('HSET', K_META, 'state', 'open') end
redis.call('SET', K_CURSOR, 1)
return 0
"#
);

/// ARGV: base, which bound (`gate` or `mirror`), at most how many, the
/// number of admissions Postgres has recorded.
/// Issues passes at the cursor while the queue is open, the entry there is
/// confirmed, and `outstanding + units <= bound`, the bound read in this
/// same step. Returns {behind, issued}: behind is 1, and nothing issued,
/// when Postgres has recorded admissions this queue never made (Redis lost
/// writes: its cursor would hand out numbers, and places, again); each
/// issued is {number, ticket, customer, issued_ms, expires_ms}.
pub(super) const ISSUE: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'state', 'units', 'pass_ms', 'admissions', 'last_issued_ms')
if (tonumber(meta[4]) or 0) < tonumber(ARGV[4]) then return {1, {}} end
if meta[1] ~= 'open' then return {0, {}} end
-- An admission's time never precedes its ticket's join or the admission
-- before it, whatever Redis's clock did meanwhile (a step back, a restart
-- on another host): the published record is checked for that.
local floor = tonumber(meta[5]) or 0
local bound_key = K_GATE_STOCK
if ARGV[2] == 'mirror' then bound_key = K_MIRROR_STOCK end
local bound = tonumber(redis.call('GET', bound_key))
if not bound then return {0, {}} end
local units, pass_ms = tonumber(meta[2]), tonumber(meta[3])
local admissions = tonumber(meta[4]) or 0
local cursor = tonumber(redis.call('GET', K_CURSOR)) or 1
local outstanding = tonumber(redis.call('GET', K_OUTSTANDING)) or 0
local max = tonumber(ARGV[3])
local out = {}
local now = nil
local skipped = false
while #out < max and outstanding + units <= bound do
  local at = redis.call('ZRANGEBYSCORE', K_LINE, cursor, cursor, 'LIMIT', 0, 1)[1]
  if not at then break end
  if redis.call('EXISTS', pass_key(at)) == 1 then
    -- Admitted already: only a record that gave this ticket another
    -- number (its place) puts it here. No ticket gets a second pass, and
    -- the line goes on rather than stop at it for ever.
    cursor = cursor + 1
    skipped = true
  else
    local e = redis.call('HMGET', entry_key(at), 'customer', 'confirmed', 'joined_ms')
    if e[2] ~= '1' then break end
    local clock = now_ms()
    now = math.max(now or 0, clock, floor, tonumber(e[3]) or 0)
    admissions = admissions + 1
    -- The pass lasts its time from the real clock: the floor only orders
    -- the record, it never lengthens a pass.
    local expires = clock + pass_ms
    redis.call('HSET', pass_key(at), 'n', admissions, 'customer', e[1], 'units', units,
      'issued_ms', now, 'expires_ms', expires, 'state', 'issued')
    redis.call('ZADD', K_DEADLINES, expires, at)
    redis.call('RPUSH', K_LOG, 'I|' .. admissions .. '|' .. at .. '|' .. e[1] .. '|' .. now .. '|' .. expires)
    outstanding = outstanding + units
    cursor = cursor + 1
    table.insert(out, {admissions, at, e[1], now, expires})
  end
end
if skipped then redis.call('SET', K_CURSOR, cursor) end
if #out > 0 then
  redis.call('SET', K_CURSOR, cursor)
  redis.call('SET', K_OUTSTANDING, outstanding)
  redis.call('HSET', K_META, 'admissions', admissions, 'last_issued_ms', now)
end
return {0, out}
"#
);

/// ARGV: base, the event as logged. Removes the log's head through the
/// first event equal to it; an event not in the log removes nothing, so a
/// drainer that read less than another never drops what the other has not
/// recorded. Returns how many were removed.
pub(super) const ACK_LOG: &str = script!(
    r#"
local at = redis.call('LPOS', K_LOG, ARGV[2])
if not at then return 0 end
redis.call('LTRIM', K_LOG, at + 1, -1)
return at + 1
"#
);

/// ARGV: base, customer, ticket, number, admission.
/// Returns {code, units}: 0 claimed, 1 no pass, 2 forged, 3 not yours,
/// 4 lapsed, 5 used, 6 in use, 7 missing. An issued pass past its deadline
/// lapses here, in the same step.
pub(super) const CLAIM: &str = script!(
    r#"
local customer, t, number, admission = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if redis.call('EXISTS', K_META) == 0 then return {7, 0} end
local p = redis.call('HMGET', pass_key(t), 'n', 'customer', 'units', 'state', 'expires_ms', 'admission')
if not p[1] then
  if redis.call('HGET', entry_key(t), 'customer') == customer then return {1, 0} end
  return {2, 0}
end
if p[1] ~= number then return {2, 0} end
if p[2] ~= customer then return {3, 0} end
-- A pass is its customer's place's: a hash no place leads to is what a
-- dropped queue left (DISCARD_BEHIND), never a pass of this queue.
if redis.call('HGET', K_BY_CUSTOMER, customer) ~= t then return {2, 0} end
local units = tonumber(p[3])
if p[4] == 'used' then return {5, 0} end
if p[4] == 'lapsed' then return {4, 0} end
if p[4] == 'claimed' then
  if p[6] == admission then return {0, units} end
  return {6, 0}
end
local now = now_ms()
if now >= tonumber(p[5]) then
  lapse_pass(t, now)
  return {4, 0}
end
redis.call('HSET', pass_key(t), 'state', 'claimed', 'admission', admission, 'claimed_ms', now)
return {0, units}
"#
);

/// ARGV: base, ticket, number, admission. A claim whose purchase wrote
/// nothing: issued again before its deadline, lapsed after it.
/// Returns 1 reissued, 2 lapsed, 0 not this admission's claim.
pub(super) const UNCLAIM: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 0 then return 0 end
local t, number, admission = ARGV[2], ARGV[3], ARGV[4]
local p = redis.call('HMGET', pass_key(t), 'n', 'state', 'expires_ms', 'admission')
if p[1] ~= number or p[2] ~= 'claimed' or p[4] ~= admission then return 0 end
local now = now_ms()
if now >= tonumber(p[3]) then
  lapse_pass(t, now)
  return 2
end
redis.call('HSET', pass_key(t), 'state', 'issued')
redis.call('HDEL', pass_key(t), 'admission', 'claimed_ms')
return 1
"#
);

/// ARGV: base, ticket, number, admission. The claim's purchase committed
/// (Postgres has the pass used by its order): `used`, its units no longer
/// outstanding. A pass found issued, not claimed, was reopened by a rebuild
/// whose snapshot predated that commit (the claim lived only in the Redis
/// that was lost): it is settled too, or it would hold a sold unit until
/// its deadline. A repeat (already used by this admission) answers 1 and
/// hands back nothing. Returns 1 or 0 (claimed by another admission, or
/// lapsed: nothing to hand back here).
pub(super) const SETTLE: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 0 then return 0 end
return settle_pass(ARGV[2], ARGV[3], ARGV[4])
"#
);

/// ARGV: base, then {ticket, number, admission} per pass Postgres has
/// used by the order with that admission key: SETTLE for each (a rebuild
/// reopened those it finds issued). Returns how many it settled.
pub(super) const SETTLE_USED: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 0 then return 0 end
local settled = 0
for i = 2, #ARGV, 3 do
  local p = redis.call('HMGET', pass_key(ARGV[i]), 'n', 'state')
  if p[1] == ARGV[i + 1] and p[2] ~= 'used' and settle_pass(ARGV[i], ARGV[i + 1], ARGV[i + 2]) == 1 then
    settled = settled + 1
  end
end
return settled
"#
);

/// ARGV: base, grace_ms. Lapses every issued pass past its deadline;
/// returns the claimed ones past deadline + grace, each {ticket, number,
/// customer, admission}.
pub(super) const LAPSE_DUE: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 0 then return {} end
local now = now_ms()
local grace = tonumber(ARGV[2])
local stale = {}
for _, t in ipairs(redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', now, 'LIMIT', 0, 1000)) do
  local p = redis.call('HMGET', pass_key(t), 'n', 'customer', 'state', 'expires_ms', 'admission')
  if p[3] == 'issued' then
    lapse_pass(t, now)
  elseif p[3] == 'claimed' then
    if tonumber(p[4]) + grace <= now then table.insert(stale, {t, tonumber(p[1]), p[2], p[5] or ''}) end
  else
    redis.call('ZREM', K_DEADLINES, t)
  end
end
return stale
"#
);

/// ARGV: base, ticket, number, admission. A claim whose purchase never
/// committed: lapsed (logged). A repeat answers 1 and hands back nothing.
pub(super) const LAPSE_CLAIM: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 0 then return 0 end
local t, number, admission = ARGV[2], ARGV[3], ARGV[4]
local p = redis.call('HMGET', pass_key(t), 'n', 'state', 'admission')
if p[1] ~= number or p[3] ~= admission then return 0 end
if p[2] == 'lapsed' then return 1 end
if p[2] ~= 'claimed' then return 0 end
lapse_pass(t, now_ms())
return 1
"#
);

/// ARGV: base, then one customer per view wanted (a batch of polls, see
/// `redis_batch`). Returns one view per customer, in order: {0} when the
/// queue is missing, else {1, state, drawn, pre_count, cursor, outstanding,
/// gate stock or '', mirror stock or '', unpaid, entry (a list or empty),
/// position or 0, pass {number, state, expires_ms} or empty}. Read-only;
/// the queue's own numbers are read once for the whole batch. An issued
/// pass past its deadline reads as lapsed (the sweep lapses it).
pub(super) const STATUS: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'state', 'drawn')
local out = {}
if not meta[1] then
  for i = 2, #ARGV do out[i - 1] = {0} end
  return out
end
local numbers = redis.call('MGET', K_CURSOR, K_OUTSTANDING, K_GATE_STOCK, K_MIRROR_STOCK, K_MIRROR_UNPAID)
local pre_count = redis.call('ZCARD', K_PRE)
local now
for i = 2, #ARGV do
  local entry, position, pass = {}, 0, {}
  local t = redis.call('HGET', K_BY_CUSTOMER, ARGV[i])
  if t then
    entry = entry_of(t)
    position = tonumber(redis.call('ZSCORE', K_LINE, t)) or 0
    local p = redis.call('HMGET', pass_key(t), 'n', 'state', 'expires_ms')
    if p[1] then
      local state = p[2]
      if state == 'issued' then
        now = now or now_ms()
        if now >= tonumber(p[3]) then state = 'lapsed' end
      end
      pass = {tonumber(p[1]), state, tonumber(p[3])}
    end
  end
  out[i - 1] = {1, meta[1], tonumber(meta[2]), pre_count, tonumber(numbers[1]) or 1,
    tonumber(numbers[2]) or 0, numbers[3] or '', numbers[4] or '', tonumber(numbers[5]) or 0,
    entry, position, pass}
end
return out
"#
);

/// ARGV: base, state, the state it must be in now (or ''). Returns 1 if
/// set, 0 refused (resume before the draw, `pre`, or not in the expected
/// state: the tick's sold-out must not undo a pause made since it looked),
/// -1 missing.
pub(super) const SET_STATE: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'drawn', 'state')
local drawn = meta[1]
if not drawn then return -1 end
local state = ARGV[2]
if state == 'pre' then return 0 end
if state == 'open' and drawn ~= '1' then return 0 end
if ARGV[3] ~= '' and meta[2] ~= ARGV[3] then return 0 end
redis.call('HSET', K_META, 'state', state)
return 1
"#
);

/// ARGV: base, hold_ms. After a rebuild not yet reconciled: {0,
/// rebuilt_ms} while joins in flight at the rebuild may still commit
/// (within `hold` of it, on Redis's clock), {1, rebuilt_ms} after; {-1, 0}
/// when there is nothing to reconcile (or no queue).
pub(super) const RECONCILE_DUE: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'state', 'rebuilt_ms', 'reconciled')
if not meta[1] or not meta[2] or meta[3] then return {-1, 0} end
local rebuilt = tonumber(meta[2])
if now_ms() < rebuilt + tonumber(ARGV[2]) then return {0, rebuilt} end
return {1, rebuilt}
"#
);

/// ARGV: base, rebuilt_ms as RECONCILE_DUE answered. Marks that rebuild
/// reconciled; a queue rebuilt again since (or gone) is left alone.
/// Returns 1 if marked.
pub(super) const MARK_RECONCILED: &str = script!(
    r#"
if redis.call('HGET', K_META, 'rebuilt_ms') ~= ARGV[2] then return 0 end
if not redis.call('HGET', K_META, 'state') then return 0 end
redis.call('HSET', K_META, 'reconciled', 1)
return 1
"#
);

/// ARGV: base, Postgres's stock, `settled_units` as read before that stock
/// was. Sets the mirror to the stock less what passes settled since: such
/// a sale may or may not be in the stock read, so it counts as sold (a
/// bound one tick low, never high). Returns the mirror.
pub(super) const MIRROR_STOCK: &str = script!(
    r#"
-- A queue freed or dropped meanwhile is not made again, key by key.
if redis.call('EXISTS', K_META) == 0 then return tonumber(ARGV[2]) end
local settled = tonumber(redis.call('HGET', K_META, 'settled_units')) or 0
local mirror = tonumber(ARGV[2]) - math.max(0, settled - tonumber(ARGV[3]))
redis.call('SET', K_MIRROR_STOCK, mirror)
return mirror
"#
);

/// ARGV: base, units in unpaid orders. Sets `:mirror_unpaid` of a queue
/// Redis has; one freed or dropped meanwhile is not made again, key by key.
pub(super) const MIRROR_UNPAID: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 0 then return 0 end
redis.call('SET', K_MIRROR_UNPAID, ARGV[2])
return 1
"#
);

/// ARGV: base. Returns {exists, joined, waiting, admitted, open passes,
/// outstanding, used, lapsed}.
pub(super) const COUNTS: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'drawn', 'admissions', 'used', 'lapsed')
if not meta[1] then return {0, 0, 0, 0, 0, 0, 0, 0} end
local cursor = tonumber(redis.call('GET', K_CURSOR)) or 1
local waiting = redis.call('ZCOUNT', K_LINE, cursor, '+inf')
if meta[1] ~= '1' then waiting = waiting + redis.call('ZCARD', K_PRE) end
return {1, redis.call('HLEN', K_BY_CUSTOMER), waiting, tonumber(meta[2]) or 0,
  redis.call('ZCARD', K_DEADLINES), tonumber(redis.call('GET', K_OUTSTANDING)) or 0,
  tonumber(meta[3]) or 0, tonumber(meta[4]) or 0}
"#
);

/// ARGV: base, then what Postgres shows the queue lost: `undrawn` (the
/// draw is revealed), `admissions` and the number Postgres has recorded,
/// or `passes` and {ticket, number, issued_ms, expires_ms} of passes this
/// queue issued under a number or ticket the record already gave another
/// admission. A queue Redis has undrawn though its draw is revealed, with
/// fewer admissions than the record, or still holding such a pass, lost
/// writes (a failover to a replica that was behind), so its passes and
/// line are older than the record. Its fixed keys but the rebuild key, the
/// pending forgets and the gate's stock are dropped (the passes guard asks
/// that the pass is still its place's), so the next tick rebuilds it from
/// Postgres. Returns 1 if it dropped the queue, 0 if
/// the queue is not behind (or gone) after all: a queue rebuilt since
/// holds the record's passes, not the conflicting ones.
pub(super) const DISCARD_BEHIND: &str = script!(
    r#"
local meta = redis.call('HMGET', K_META, 'drawn', 'admissions')
if not meta[1] then return 0 end
local behind = false
if ARGV[2] == 'undrawn' then
  behind = meta[1] == '0'
elseif ARGV[2] == 'admissions' then
  behind = (tonumber(meta[2]) or 0) < tonumber(ARGV[3])
else
  for i = 3, #ARGV, 4 do
    local t = ARGV[i]
    local p = redis.call('HMGET', pass_key(t), 'n', 'issued_ms', 'expires_ms', 'customer')
    if p[1] == ARGV[i + 1] and tonumber(p[2]) == tonumber(ARGV[i + 2])
      and tonumber(p[3]) == tonumber(ARGV[i + 3])
      and redis.call('HGET', K_BY_CUSTOMER, p[4]) == t then behind = true end
  end
end
if not behind then return 0 end
-- The fixed keys only, unlinked (freed off Redis's main thread): a
-- crowd's queue has a hundred thousand per-ticket hashes, and deleting
-- them here held Redis for half a second. The rebuild rewrites those of
-- every place in the record (passes cleared first); any other is reached
-- by nothing (CLAIM and STATUS go by `:by_customer`).
redis.call('UNLINK', K_META, K_BY_CUSTOMER, K_SEQ, K_PRE, K_LINE, K_CURSOR, K_DEADLINES,
  K_OUTSTANDING, K_LOG, K_UNCONFIRMED, K_MIRROR_STOCK, K_MIRROR_UNPAID, K_DRAWING)
-- The hashes left are paged for if the sale ends before a rebuild
-- (RETIRE goes on from this mark); a rebuild takes it.
redis.call('SET', base .. 'retiring', '0')
return 1
"#
);

/// ARGV: base, keys to look at, whether this call may begin ('1': its
/// caller has just seen the sale over for good). Frees a finished queue
/// from Redis, a page of the keyspace per call.
///
/// A retirement begins only while the log is empty (every admission and
/// lapse is in Postgres), no pass is open, no place waits to be confirmed
/// or forgotten and nobody rebuilds. It unlinks the fixed keys at once, so
/// from then on every script finds the queue gone and writes nothing into
/// it, and a sale an admin makes live again is rebuilt from the record
/// like any queue Redis lost. Each call then unlinks a page's keys under
/// `base` (the per-ticket hashes, also those a discarded life or a
/// rebuilder that died part-way left, which nothing else reaches).
///
/// `:retiring` holds the SCAN cursor of the next page (and the server
/// that gave it), so any caller (any instance, or one that restarted) goes
/// on where the last call stopped: the keyspace is paged once, however
/// many instances tick. DISCARD_BEHIND
/// and REBUILD_BEGIN leave it at '0' (hashes left behind, if the rebuild
/// dies), REBUILD_FINISH and PREPARE take it (a whole queue is no one's to
/// free); nothing is freed while a rebuild runs.
///
/// Returns {'-1'} when it may not begin, {'-2'} when the queue was made
/// again meanwhile (nothing more is freed), else {next cursor}, '0' once
/// the queue is gone (or was never there).
pub(super) const RETIRE: &str = script!(
    r#"
local K_RETIRING = base .. 'retiring'
local function made_again()
  return redis.call('EXISTS', K_META) == 1 or redis.call('EXISTS', K_REBUILD) == 1
end
-- A SCAN cursor means something only to the server that gave it (its
-- table, hashed with a seed of its own): a mark another server wrote (a
-- failover, a restart) is paged from the start.
local server = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
local mark = redis.call('GET', K_RETIRING)
local cursor = mark
if mark then
  local from, at = string.match(mark, '^(%x*):(%d+)$')
  if from == server then cursor = at else cursor = '0' end
end
if not mark then
  if ARGV[3] ~= '1' then
    if made_again() then return {'-2'} end
    return {'0'}
  end
  if redis.call('EXISTS', K_REBUILD) == 1 then return {'-1'} end
  if redis.call('EXISTS', K_META) == 0 then return {'0'} end
  if redis.call('LLEN', K_LOG) > 0 or redis.call('ZCARD', K_DEADLINES) > 0
    or redis.call('ZCARD', K_UNCONFIRMED) > 0 or redis.call('SCARD', K_FORGET) > 0 then
    return {'-1'}
  end
  redis.call('UNLINK', K_META, K_BY_CUSTOMER, K_SEQ, K_PRE, K_LINE, K_CURSOR, K_DEADLINES,
    K_OUTSTANDING, K_LOG, K_UNCONFIRMED, K_MIRROR_STOCK, K_MIRROR_UNPAID, K_FORGET, K_DRAWING)
  cursor = '0'
elseif redis.call('EXISTS', K_REBUILD) == 1 then
  return {'-1'}
elseif redis.call('EXISTS', K_META) == 1 then
  redis.call('UNLINK', K_RETIRING)
  return {'-2'}
end
local pattern = string.gsub(base, '[%*%?%[%]\\]', '\\%0') .. '*'
local page = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', ARGV[2])
for _, key in ipairs(page[2]) do
  if key ~= K_RETIRING then redis.call('UNLINK', key) end
end
if page[1] == '0' then
  redis.call('UNLINK', K_RETIRING)
else
  redis.call('SET', K_RETIRING, server .. ':' .. page[1])
end
return {page[1]}
"#
);

// A rebuild runs in parts (REBUILD_BEGIN, then REBUILD_PART calls of a
// bounded size, then REBUILD_FINISH), so a queue of a hundred thousand
// places never holds Redis, and every gate and poll behind it, for longer
// than one part. `:meta` is written last: until then the queue is missing
// to every other script, and those that would write a place or a pass
// answer as for a missing queue, so nothing reads or changes a half-built
// queue. Each part requires the rebuild key to hold its rebuilder's token.

/// ARGV: base, token, ttl_ms. Takes the rebuild key for `token` while the
/// queue is missing and nobody else holds it, and clears what a rebuilder
/// that died part-way left in the keys a rebuild fills (places and passes
/// it left are overwritten, or unreachable once `:by_customer` is
/// cleared). Returns 1 if taken.
pub(super) const REBUILD_BEGIN: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 1 then return 0 end
if not redis.call('SET', K_REBUILD, ARGV[2], 'NX', 'PX', ARGV[3]) then return 0 end
redis.call('UNLINK', K_BY_CUSTOMER, K_SEQ, K_PRE, K_LINE, K_CURSOR, K_DEADLINES, K_OUTSTANDING,
  K_LOG, K_UNCONFIRMED, K_DRAWING)
-- What is written from here on is left behind if this rebuilder dies: a
-- retirement pages from the start for it (RETIRE), and REBUILD_FINISH
-- takes the mark.
redis.call('SET', base .. 'retiring', '0')
return 1
"#
);

/// ARGV: base, token, ttl_ms, units, kind, then the part (none for
/// `renew`, which only keeps the key while the rebuilder reads): `entries`
/// {ticket, customer, seq, joined_ms, late}×, `line` the first position
/// then tickets in line order, or `passes` {number, ticket, customer,
/// issued_ms, expires_ms, state}×. Returns 1, or 0 when the rebuild key is
/// no longer this rebuilder's (it expired and another began) or the queue
/// exists.
pub(super) const REBUILD_PART: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 1 then return 0 end
if redis.call('GET', K_REBUILD) ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', K_REBUILD, ARGV[3])
local units = tonumber(ARGV[4])
local kind = ARGV[5]
if kind == 'renew' then return 1 end
if kind == 'entries' then
  for i = 6, #ARGV, 5 do
    local t, customer, seq, joined, late = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
    redis.call('HSET', entry_key(t), 'customer', customer, 'seq', seq, 'joined_ms', joined, 'late', late,
      'confirmed', 1, 'created_ms', joined)
    -- A pass an earlier life of the queue gave this place is not the
    -- record's unless the passes part writes it again.
    redis.call('DEL', pass_key(t))
    redis.call('HSET', K_BY_CUSTOMER, customer, t)
    if late == '0' then redis.call('ZADD', K_PRE, seq, t) end
  end
elseif kind == 'line' then
  local position = tonumber(ARGV[6])
  for i = 7, #ARGV do
    redis.call('ZADD', K_LINE, position, ARGV[i])
    position = position + 1
  end
else
  for i = 6, #ARGV, 6 do
    local n, t, customer, issued, expires, state = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
    -- Also clears what a pass of an earlier life of the queue had.
    redis.call('DEL', pass_key(t))
    redis.call('HSET', pass_key(t), 'n', n, 'customer', customer, 'units', units,
      'issued_ms', issued, 'expires_ms', expires, 'state', state)
    if state == 'issued' then redis.call('ZADD', K_DEADLINES, expires, t) end
  end
end
return 1
"#
);

/// ARGV: base, token. A rebuilder that failed lets go of the rebuild key,
/// if it is still its own.
pub(super) const REBUILD_ABANDON: &str = script!(
    r#"
if redis.call('GET', K_REBUILD) ~= ARGV[2] then return 0 end
redis.call('DEL', K_REBUILD)
return 1
"#
);

/// ARGV: base, token, starts_at_ms, pass_ms, units, state, drawn, max_seq,
/// last_join_ms, line length, admissions, outstanding, used, lapsed,
/// last_issued_ms, cursor, the highest admission number. Completes this rebuilder's rebuild: the counters, then
/// `:meta`, which makes the queue exist. Returns 1 if rebuilt.
pub(super) const REBUILD_FINISH: &str = script!(
    r#"
if redis.call('EXISTS', K_META) == 1 then return 0 end
if redis.call('GET', K_REBUILD) ~= ARGV[2] then return 0 end
redis.call('SET', K_SEQ, ARGV[8])
redis.call('SET', K_CURSOR, ARGV[16])
redis.call('SET', K_OUTSTANDING, ARGV[12])
redis.call('HSET', K_META, 'starts_at_ms', ARGV[3], 'pass_ms', ARGV[4], 'units', ARGV[5],
  'state', ARGV[6], 'drawn', ARGV[7], 'last_join_ms', ARGV[9], 'tail', ARGV[10],
  'admissions', ARGV[11], 'used', ARGV[13], 'lapsed', ARGV[14], 'last_issued_ms', ARGV[15],
  'rebuilt_ms', now_ms(), 'life', now_ms(), 'rebuilt_admissions', ARGV[17],
  'checked_seq', ARGV[8])
-- (Places of the record numbered below the snapshot's last that commit
-- after it are the reconcile's, which confirms the whole record.)
-- The snapshot may predate rows still committing: the tick puts those
-- places back (CONFIRM) before it draws.
redis.call('HDEL', K_META, 'reconciled')
redis.call('DEL', K_REBUILD)
-- Whole again: no one's to free (a retirement begins anew, from its
-- sale's end).
redis.call('UNLINK', base .. 'retiring')
return 1
"#
);
